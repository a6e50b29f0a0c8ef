"""`tidemq cluster list`: every broker of every cluster, its role and its replication lag.

    CLUSTER  BROKER    ID  ROLE         ADDRESS          MAX OFFSET  LAG BYTES  LAG S  STATE
    Default  broker-a  0   SYNC_MASTER  127.0.0.1:10911  1048576     -          -      1 slave(s)
    Default  broker-a  1   SLAVE        127.0.0.1:10921  1048000     576        0.2    following ...
    Default  broker-b  0   -            127.0.0.1:10931  -           -          -      unreachable

Who is there comes from the name servers (GET_BROKER_CLUSTER_INFO, 106): every registered
broker, masters (brokerId 0) and slaves (1, 2, ...). Each is then asked GET_BROKER_RUNTIME_INFO
(28), all at once, each with its own timeout, and the row is read from the runtime-info keys of
issue 13 (the broker's handlers/admin.py writes them):

    both roles  brokerRole, commitLogMaxOffset, commitLogMinOffset
    master      haSlaveCount, haSlaves = "addr,brokerId,ackedOffset,lagBytes,lagMs;..."
    slave       haMasterAddr, haConnected, haReplicaOffset, haMasterMaxOffset, haLagBytes,
                haLagMs, haRefusedReason

Controller mode (issue 14) adds controllerEpoch, syncStateSet, replicaId and controllerRole:
the STATE column then ends with the epoch and, on the master, the in-sync set ("epoch 3,
in-sync 1,2,3"); a STANDBY replica (recovered, waiting for the controller) says so.

A slave's lag is its own view (how far its replica is behind the master's end as it last heard
it), so it is shown even while the master is down. When the slave does not answer, the master's
view of it (haSlaves: what it acknowledged) fills the lag columns. A broker that does not answer
(stopped, paused, or gone but still listed: a name server keeps a silent broker for up to two
minutes) shows "unreachable" and the listing goes on: one dead broker must not hide the others.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from tidemq.cli.credentials import add_options, credentials_of
from tidemq.cli.hints import fail
from tidemq.cli.output import add_json_flag, emit_json, wants_json
from tidemq.cli.table import print_table
from tidemq.cli.tls_options import add_client_flags, tls_of
from tidemq.client.admin import Admin
from tidemq.client.tls import TlsOption
from tidemq.errors import QueueError
from tidemq.protocol.bodies import ClusterInfo, KVTable
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.security.signing import Credentials

# How long one broker may take to answer its runtime info before its row says "unreachable".
# All brokers are asked at once, so this is also about how long the listing takes at worst.
RUNTIME_INFO_TIMEOUT_MS_DEFAULT: Final = 3_000
HEADER: Final = [
    "CLUSTER",
    "BROKER",
    "ID",
    "ROLE",
    "ADDRESS",
    "MAX OFFSET",
    "LAG BYTES",
    "LAG S",
    "STATE",
]
_NONE: Final = "-"


@dataclass(frozen=True, slots=True)
class BrokerAnswer:
    """One registered broker and its runtime info (None: it did not answer; `error` says why)."""

    cluster: str
    broker_name: str
    broker_id: int
    addr: str
    info: Mapping[str, str] | None
    error: str = ""


@dataclass(frozen=True, slots=True)
class SlaveSeen:
    """One entry of a master's haSlaves: a slave as the master sees it."""

    addr: str
    broker_id: int
    acked_offset: int
    lag_bytes: int
    lag_ms: int


def parse_ha_slaves(text: str) -> dict[int, SlaveSeen]:
    """haSlaves ("addr,brokerId,ackedOffset,lagBytes,lagMs;...") by brokerId; a malformed
    entry is left out (the listing shows what it can rather than failing)."""
    seen: dict[int, SlaveSeen] = {}
    for entry in filter(None, text.split(";")):
        parts = entry.split(",")
        if len(parts) != 5:
            continue
        try:
            slave = SlaveSeen(parts[0], *(int(part) for part in parts[1:]))
        except ValueError:
            continue
        seen[slave.broker_id] = slave
    return seen


def _seconds(lag_ms: str | int) -> str:
    try:
        return f"{int(lag_ms) / 1000:.1f}"
    except ValueError:
        return _NONE


def _controller_state(info: Mapping[str, str], *, master: bool) -> str:
    """ ", epoch 3, in-sync 1,2,3" for a controller-mode broker ("" otherwise)."""
    epoch = info.get("controllerEpoch")
    if epoch is None:
        return ""
    in_sync = f", in-sync {info.get('syncStateSet') or _NONE}" if master else ""
    return f", epoch {epoch}{in_sync}"


def _master_state(info: Mapping[str, str]) -> str:
    count = info.get("haSlaveCount")
    state = _NONE if count is None else f"{count} slave(s)"
    return state + _controller_state(info, master=True)


def _slave_state(info: Mapping[str, str]) -> str:
    refused = info.get("haRefusedReason", "")
    master = info.get("haMasterAddr", "")
    if refused:
        return f"refused by {master or 'master'}: {refused}"
    if info.get("controllerRole") == "STANDBY":
        return "standby: waiting for the controller"
    if info.get("haConnected") == "true":
        return f"following {master}" + _controller_state(info, master=False)
    return f"connecting to {master}" if master else "no master known"


def row_cells(answer: BrokerAnswer, master_view: Mapping[int, SlaveSeen]) -> list[str]:
    """The table row of one broker; `master_view` is its group master's haSlaves, parsed."""
    head = [answer.cluster, answer.broker_name, str(answer.broker_id)]
    info = answer.info
    if info is None:
        seen = master_view.get(answer.broker_id) if answer.broker_id > 0 else None
        lag = [str(seen.lag_bytes), _seconds(seen.lag_ms)] if seen else [_NONE, _NONE]
        state = f"unreachable ({answer.error})" if answer.error else "unreachable"
        return [*head, _NONE, answer.addr, _NONE, *lag, state]
    role = info.get("brokerRole", _NONE)
    max_offset = info.get("commitLogMaxOffset", _NONE)
    if role == "SLAVE" or (role == _NONE and answer.broker_id > 0):
        lag = [info.get("haLagBytes", _NONE), _seconds(info.get("haLagMs", _NONE))]
        return [*head, role, answer.addr, max_offset, *lag, _slave_state(info)]
    return [*head, role, answer.addr, max_offset, _NONE, _NONE, _master_state(info)]


def cluster_rows(answers: list[BrokerAnswer]) -> list[list[str]]:
    """The whole table (header first): by cluster, broker name, then brokerId (master first)."""
    masters = {
        (a.cluster, a.broker_name): parse_ha_slaves(a.info.get("haSlaves", ""))
        for a in answers
        if a.broker_id == 0 and a.info is not None
    }
    rows = [list(HEADER)]
    for answer in sorted(answers, key=lambda a: (a.cluster, a.broker_name, a.broker_id)):
        rows.append(row_cells(answer, masters.get((answer.cluster, answer.broker_name), {})))
    return rows


async def _runtime_info(
    admin: Admin, addr: str, timeout_ms: float
) -> tuple[dict[str, str] | None, str]:
    """(runtime info, "") or (None, why it is missing)."""
    cmd = RemotingCommand(code=RequestCode.GET_BROKER_RUNTIME_INFO)
    try:
        response = await admin.instance.remoting.invoke(addr, cmd, timeout_ms)
    except QueueError as error:
        return None, type(error).__name__
    if response.code != ResponseCode.SUCCESS:
        return None, f"code {response.code}: {response.remark or ''}".rstrip(": ")
    try:
        return KVTable.from_json(response.body).table, ""
    except QueueError as error:
        return None, f"bad answer: {error}"


async def fetch_answers(admin: Admin, timeout_ms: float) -> list[BrokerAnswer]:
    """Every registered broker of `admin`'s name servers, each with its runtime info."""
    info: ClusterInfo = await admin.cluster_info()
    brokers = [
        (cluster, name, broker_id, addr)
        for cluster, names in info.cluster_addr_table.items()
        for name in names
        if (data := info.broker_addr_table.get(name)) is not None
        for broker_id, addr in data.broker_addrs.items()
    ]
    results = await asyncio.gather(
        *(_runtime_info(admin, addr, timeout_ms) for *_, addr in brokers)
    )
    return [
        BrokerAnswer(cluster, name, broker_id, addr, table, error)
        for (cluster, name, broker_id, addr), (table, error) in zip(brokers, results, strict=True)
    ]


async def _list(
    namesrv_addr: str, timeout_ms: float, credentials: Credentials | None, tls: TlsOption
) -> list[BrokerAnswer]:
    async with Admin(
        namesrv_addr, timeout_ms=timeout_ms, credentials=credentials, tls=tls
    ) as admin:
        return await fetch_answers(admin, timeout_ms)


def add_actions(
    actions: argparse._SubParsersAction[argparse.ArgumentParser], namesrv_default: str
) -> None:
    """`tidemq cluster list` under the `cluster` verb's actions."""
    listing = actions.add_parser("list", help="brokers of each cluster: role, offsets, lag")
    listing.add_argument(
        "-n",
        "--namesrv-addr",
        default=namesrv_default,
        help=f"name servers, ';'-separated (default {namesrv_default})",
    )
    listing.add_argument(
        "--timeout-ms",
        type=int,
        default=RUNTIME_INFO_TIMEOUT_MS_DEFAULT,
        help="how long each broker may take to answer before it is shown unreachable",
    )
    add_options(listing)  # --access-key / --secret-key
    add_client_flags(listing, default=argparse.SUPPRESS)  # --tls, --tls-ca, ...
    add_json_flag(listing).set_defaults(run=run_cluster_list)


def run_cluster_list(args: argparse.Namespace) -> int:
    try:
        answers = asyncio.run(
            _list(args.namesrv_addr, args.timeout_ms, credentials_of(args), tls_of(args))
        )
    except QueueError as error:
        return fail(error, args)
    if wants_json(args):
        emit_json({"brokers": [_broker_document(a) for a in answers]})
        return 0
    print_table(cluster_rows(answers))
    return 0


def _broker_document(answer: BrokerAnswer) -> dict[str, object]:
    """One broker for --json: who it is and its runtime info as it answered (None: it did not,
    and `error` says why)."""
    return {
        "cluster": answer.cluster,
        "broker_name": answer.broker_name,
        "broker_id": answer.broker_id,
        "addr": answer.addr,
        "reachable": answer.info is not None,
        "error": answer.error,
        "runtime_info": dict(answer.info) if answer.info is not None else None,
    }
