"""RpcLatency, the RPC timing behind rocketmq_rpc_latency: one bucket per bound (le), +Inf, and
the sum in ns; a coalesced group recorded at once counts every request of it."""

from __future__ import annotations

from tidemq.protocol.frame import RemotingCommand
from tidemq.remoting.handlers import RPC_LATENCY_BOUNDS_MS, RpcLatency

MS = 1_000_000


def test_a_request_lands_in_the_first_bound_at_or_above_it() -> None:
    rpc = RpcLatency()
    rpc.record(10, 0, MS)  # exactly 1 ms: le=1
    rpc.record(10, 0, MS + 1)  # just over: le=3
    rpc.record(10, 0, 10_000 * MS)  # over every bound: +Inf
    counts = rpc.buckets[(10, 0)]
    assert counts[0] == 1
    assert counts[1] == 1
    assert counts[len(RPC_LATENCY_BOUNDS_MS)] == 1  # the +Inf slot
    assert counts[-1] == MS + MS + 1 + 10_000 * MS


def test_a_group_recorded_at_once_counts_each_request() -> None:
    rpc = RpcLatency()
    rpc.record_many(310, 0, 2 * MS, 5)
    rpc.record_many(310, 0, 50, 3)
    counts = rpc.buckets[(310, 0)]
    assert counts[0] == 3  # 50 ns, le=1 ms
    assert counts[1] == 5  # 2 ms, le=3 ms
    assert counts[-1] == 5 * 2 * MS + 3 * 50


def test_a_deferred_request_is_timed_from_begin_to_end() -> None:
    rpc = RpcLatency()
    request = RemotingCommand(code=36)
    rpc.begin(request)
    rpc.end(request, 17)
    rpc.end(request, 17)  # answered twice: counted once
    assert sum(rpc.buckets[(36, 17)][:-1]) == 1
