"""The replication keys of GET_BROKER_RUNTIME_INFO (28), as `tidemq cluster list` reads them.

    both roles  brokerRole, commitLogMaxOffset, commitLogMinOffset (RocketMQ's names; the two
                offsets are answered by admin.py)
    master      haSlaveCount   number of connected slaves
                haSlaves       ";"-joined "addr,brokerId,ackedOffset,lagBytes,lagMs", one per
                               slave ("" with none)
    slave       haMasterAddr       the master's HA address ("" while unknown)
                haConnected        "true" | "false"
                haReplicaOffset    the slave's commit-log end
                haMasterMaxOffset  the master's end, as last heard (handshake or frame)
                haLagBytes         haMasterMaxOffset - haReplicaOffset (0 when caught up)
                haLagMs            0 when caught up, else ms since the replica last reached
                                   the master's end
                haRefusedReason    why the master refused to stream ("" when following)

All values are strings (the body is a KVTable). The HA services' types are read through the small
protocols below, so this module does not import broker/ha/.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol


class SlaveView(Protocol):
    """One slave as the HA master sees it (broker/ha: SlaveInfo)."""

    @property
    def addr(self) -> str: ...
    @property
    def broker_id(self) -> int: ...
    @property
    def acked_offset(self) -> int: ...
    @property
    def lag_bytes(self) -> int: ...
    @property
    def lag_ms(self) -> int: ...


class SlaveStateView(Protocol):
    """A slave's own replication state (broker/ha: SlaveState)."""

    @property
    def master_addr(self) -> str | None: ...
    @property
    def connected(self) -> bool: ...
    @property
    def replica_offset(self) -> int: ...
    @property
    def master_max(self) -> int: ...
    @property
    def refused_reason(self) -> str | None: ...
    @property
    def lag_bytes(self) -> int: ...
    @property
    def lag_ms(self) -> int: ...


HAFields = Callable[[], dict[str, str]]


def master_fields(slaves: Sequence[SlaveView]) -> dict[str, str]:
    """A master's keys from its HA master's `slaves()` (empty without an HA listener)."""
    entries = [
        f"{s.addr},{s.broker_id},{s.acked_offset},{s.lag_bytes},{s.lag_ms}"
        for s in sorted(slaves, key=lambda s: (s.broker_id, s.addr))
    ]
    return {"haSlaveCount": str(len(entries)), "haSlaves": ";".join(entries)}


def slave_fields(state: SlaveStateView) -> dict[str, str]:
    """A slave's keys from its HA slave's `state()`."""
    return {
        "haMasterAddr": state.master_addr or "",
        "haConnected": "true" if state.connected else "false",
        "haReplicaOffset": str(state.replica_offset),
        "haMasterMaxOffset": str(state.master_max),
        "haLagBytes": str(state.lag_bytes),
        "haLagMs": str(state.lag_ms),
        "haRefusedReason": state.refused_reason or "",
    }
