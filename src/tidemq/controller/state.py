"""A broker group's failover state and its transitions: pure values, no I/O.

Everything a failover decides is one value, the group state, kept in etcd under one key and
changed only by compare-and-swap (etcd.py). This module is that value, its JSON form, the
transitions a member may CAS in, the alive record each member keeps on its lease, the key names,
and the truncation rule a follower applies to its log before it follows.

    {prefix}/groups/{cluster}/{name}/
        state              GroupState   epoch, master, addrs, syncSet, epochs   (CAS only)
        alive/{replicaId}  AliveRecord  addr, haAddr, maxOffset, lastEpoch     (on a lease)

    first   (no state)           -> epoch 1, master m, syncSet {m}, epochs [(1, offset)]
    elect   epoch e, master any  -> epoch e+1, master c, syncSet {c}, epochs + (e+1, offset)
    shrink  syncSet S            -> S - ids        (the master only; it stays in)
    expand  syncSet S            -> S | ids        (the master only)

Why `elect` resets syncSet to the candidate alone: the others have not yet truncated to the new
epoch and acknowledged its start, so none of them is known to hold what the new master will
acknowledge; the master adds each back (expand) once it has caught up.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from dataclasses import dataclass
from typing import Any, Final, NamedTuple

import orjson

from tidemq.errors import QueueError

# How many (epoch, startOffset) entries the state keeps. A replica whose last local epoch is
# older than the oldest kept one cannot be matched to the history and must be wiped.
EPOCH_HISTORY_MAX: Final = 256
NO_MASTER: Final = 0


class ControllerError(QueueError):
    """The controller cannot go on: a malformed state in etcd, a replica whose history does not
    match the group's, or etcd unreachable (EtcdUnavailable)."""


class EtcdUnavailable(ControllerError):
    """etcd did not answer in time or refused the call: unlike a lost CAS, nothing was decided,
    and the caller retries later."""


class Addrs(NamedTuple):
    """Where a member serves clients (`addr`) and replicas (`ha_addr`), both "ip:port"."""

    addr: str
    ha_addr: str


Epochs = tuple[tuple[int, int], ...]


def _trim(epochs: Epochs) -> Epochs:
    return epochs[-EPOCH_HISTORY_MAX:]


@dataclass(frozen=True, slots=True)
class GroupState:
    """The group's master (0: none), its epoch and addresses, the in-sync set acks wait for, and
    the history of (epoch, start offset) pairs followers truncate by."""

    epoch: int
    master: int
    master_addr: str
    master_ha_addr: str
    sync_set: frozenset[int]
    epochs: Epochs

    @classmethod
    def first(cls, master: int, addrs: Addrs, offset: int) -> GroupState:
        """The state a group's first member creates (create-if-absent): master of epoch 1."""
        assert master >= 1
        assert offset >= 0
        return cls(1, master, addrs.addr, addrs.ha_addr, frozenset({master}), ((1, offset),))

    def elect(self, candidate: int, addrs: Addrs, start_offset: int) -> GroupState:
        """`candidate` (in syncSet, its log final at `start_offset`) as master of the next epoch."""
        assert candidate in self.sync_set, f"{candidate} is not in syncSet {sorted(self.sync_set)}"
        assert start_offset >= 0
        epoch = self.epoch + 1
        return GroupState(
            epoch=epoch,
            master=candidate,
            master_addr=addrs.addr,
            master_ha_addr=addrs.ha_addr,
            sync_set=frozenset({candidate}),
            epochs=_trim((*self.epochs, (epoch, start_offset))),
        )

    def shrink(self, ids: frozenset[int]) -> GroupState:
        """syncSet without `ids` (laggards); the master never removes itself."""
        assert self.master != NO_MASTER
        assert self.master not in ids
        return dataclasses.replace(self, sync_set=self.sync_set - ids)

    def expand(self, ids: frozenset[int]) -> GroupState:
        """syncSet with `ids` (caught-up slaves) added."""
        assert self.master != NO_MASTER
        assert self.master in self.sync_set
        return dataclasses.replace(self, sync_set=self.sync_set | ids)

    def to_json(self) -> bytes:
        return orjson.dumps(
            {
                "epoch": self.epoch,
                "master": self.master,
                "masterAddr": self.master_addr,
                "masterHaAddr": self.master_ha_addr,
                "syncSet": sorted(self.sync_set),
                "epochs": [list(entry) for entry in self.epochs],
            }
        )

    @classmethod
    def from_json(cls, raw: bytes) -> GroupState:
        """Parse a state value; anything but the exact shape raises ControllerError, since a
        guessed state could elect a replica that lacks acknowledged messages."""
        doc = _object(raw, "group state")
        epochs = doc.get("epochs")
        if not isinstance(epochs, list) or not epochs:
            raise ControllerError(f"malformed group state: epochs {epochs!r}")
        history = tuple(_epoch_entry(entry) for entry in epochs)
        sync_set = doc.get("syncSet")
        if not isinstance(sync_set, list):
            raise ControllerError(f"malformed group state: syncSet {sync_set!r}")
        state = cls(
            epoch=_int(doc, "epoch", minimum=1),
            master=_int(doc, "master", minimum=0),
            master_addr=_str(doc, "masterAddr"),
            master_ha_addr=_str(doc, "masterHaAddr"),
            sync_set=frozenset(_int_value(item, "syncSet", 1) for item in sync_set),
            epochs=history,
        )
        if history[-1][0] != state.epoch:
            raise ControllerError(f"malformed group state: epoch {state.epoch}, history {epochs}")
        _check_consistent(state)
        return state


@dataclass(frozen=True, slots=True)
class AliveRecord:
    """What a member publishes on its lease: its addresses and log end (for the operator and
    for the master's view of the group), and its last recorded epoch, so that no replica
    creates a missing state while one holding the group's history is alive (rules.py).

    `last_epoch` None: unknown (a record from a version without the field), which counts as
    "may hold history"."""

    addr: str
    ha_addr: str
    max_offset: int
    last_epoch: int | None = None

    def to_json(self) -> bytes:
        doc: dict[str, object] = {
            "addr": self.addr,
            "haAddr": self.ha_addr,
            "maxOffset": self.max_offset,
        }
        if self.last_epoch is not None:
            doc["lastEpoch"] = self.last_epoch
        return orjson.dumps(doc)

    @classmethod
    def from_json(cls, raw: bytes) -> AliveRecord:
        doc = _object(raw, "alive record")
        last = _int(doc, "lastEpoch", minimum=0) if "lastEpoch" in doc else None
        return cls(_str(doc, "addr"), _str(doc, "haAddr"), _int(doc, "maxOffset", minimum=0), last)


def _check_consistent(state: GroupState) -> None:
    """What every state a member CASes satisfies; a state that breaks it was written by hand or
    by a bug, and acting on it (electing from it, truncating by it) could lose data."""
    for (epoch, start), (next_epoch, next_start) in itertools.pairwise(state.epochs):
        if next_epoch <= epoch or next_start < start:
            raise ControllerError(
                f"malformed group state: epochs {[list(e) for e in state.epochs]} (epochs must "
                "increase strictly and their starts must not decrease)"
            )
    if state.master == NO_MASTER:
        return
    if state.master not in state.sync_set:
        raise ControllerError(
            f"malformed group state: master {state.master} is not in syncSet "
            f"{sorted(state.sync_set)}"
        )
    for name, addr in (("masterAddr", state.master_addr), ("masterHaAddr", state.master_ha_addr)):
        if not _is_host_port(addr):
            raise ControllerError(f"malformed group state: {name} {addr!r} (host:port)")


def _is_host_port(addr: str) -> bool:
    host, colon, port = addr.rpartition(":")
    return bool(host and colon and _PORT.fullmatch(port) and 0 < int(port) < 65536)


_PORT: Final = re.compile(r"[0-9]{1,5}")
# A replica id as an alive key names it: brokerId >= 1, ASCII digits only ("²".isdigit() is True
# but int() refuses it), at most 10 digits.
_REPLICA_ID: Final = re.compile(r"[1-9][0-9]{0,9}")


def _object(raw: bytes, what: str) -> dict[str, Any]:
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise ControllerError(f"malformed {what}: {e}") from None
    if not isinstance(doc, dict):
        raise ControllerError(f"malformed {what}: not an object: {raw[:200]!r}")
    return doc


def _int_value(value: object, name: str, minimum: int) -> int:
    # bool is an int subclass; `true` is no epoch.
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ControllerError(f"malformed {name}: {value!r} (an integer >= {minimum})")
    return value


def _int(doc: dict[str, Any], name: str, minimum: int) -> int:
    return _int_value(doc.get(name), name, minimum)


def _str(doc: dict[str, Any], name: str) -> str:
    value = doc.get(name)
    if not isinstance(value, str):
        raise ControllerError(f"malformed {name}: {value!r} (a string)")
    return value


def _epoch_entry(entry: object) -> tuple[int, int]:
    if not isinstance(entry, list) or len(entry) != 2:
        raise ControllerError(f"malformed epochs entry: {entry!r} ([epoch, startOffset])")
    return _int_value(entry[0], "epoch", 1), _int_value(entry[1], "startOffset", 0)


def group_prefix(prefix: str, cluster: str, name: str) -> str:
    """Every key of one group starts with this (the member watches it)."""
    return f"{prefix.rstrip('/')}/groups/{cluster}/{name}/"


def state_key(prefix: str, cluster: str, name: str) -> str:
    return group_prefix(prefix, cluster, name) + "state"


def alive_prefix(prefix: str, cluster: str, name: str) -> str:
    return group_prefix(prefix, cluster, name) + "alive/"


def alive_key(prefix: str, cluster: str, name: str, replica_id: int) -> str:
    return alive_prefix(prefix, cluster, name) + str(replica_id)


def alive_id(key: str, alive_prefix_: str) -> int | None:
    """The replica id an alive key names, or None for any other key (a stray key under the
    prefix must not stop the member from reading the others)."""
    if not key.startswith(alive_prefix_):
        return None
    rest = key[len(alive_prefix_) :]
    return int(rest) if _REPLICA_ID.fullmatch(rest) else None


def truncation_point(local_last_epoch: int | None, history: Epochs, local_max: int) -> int | None:
    """Where a replica must cut its log before following the group's current master.

    Its data is valid up to the start of the first epoch after its own last one: from there on,
    the master of that newer epoch wrote the history, and anything this replica holds past that
    point (written by an old master, never acknowledged by the group) must go.

    Args:
        local_last_epoch: the last epoch in the replica's epoch file (None: the file is empty).
        history: the group's (epoch, startOffset) entries, oldest first (GroupState.epochs).
        local_max: the replica's log end.

    Returns:
        The offset to truncate to, or None when nothing needs cutting.

    Raises:
        ControllerError: the replica's epoch is trimmed from or unknown to the history, or it
        holds data without an epoch file and epoch 1 is trimmed; the operator must wipe it.
    """
    if local_last_epoch is None:
        # A log from before controller mode (a 4.x master or slave): its data is as good as the
        # first controller epoch's master's up to that epoch's start, which the full history
        # still shows; once epoch 1 is trimmed from it, nothing can vouch for the log.
        if local_max == 0:
            return None
        if not history or history[0][0] != 1:
            raise ControllerError(
                f"the replica holds {local_max} bytes of log but no epoch file, and the group's "
                "history no longer starts at epoch 1: it cannot be matched; wipe its store"
            )
        start = history[0][1]
        return start if start < local_max else None
    known = {epoch for epoch, _start in history}
    if local_last_epoch not in known:
        oldest = history[0][0] if history else None
        why = "older than the oldest kept" if oldest and local_last_epoch < oldest else "unknown to"
        raise ControllerError(
            f"the replica's last epoch {local_last_epoch} is {why} the group's epoch history "
            f"(oldest kept {oldest}): wipe its store"
        )
    for epoch, start in history:
        if epoch > local_last_epoch:
            return start if start < local_max else None
    return None
