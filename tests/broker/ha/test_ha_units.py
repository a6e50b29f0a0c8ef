"""The HA parts that need no connection: settings checks, addresses, the ack waiter list, the
choice of master when name servers disagree."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import pytest
from ha_harness import settings

from tidemq.broker.ha.acks import AckWaiters
from tidemq.broker.ha.settings import WINDOW_BYTES, window_bytes
from tidemq.broker.ha.slave import parse_address
from tidemq.broker.replication import MasterChoice
from tidemq.limits import MESSAGE_BODY_SIZE_MAX
from tidemq.protocol.codes import ResponseCode


@pytest.mark.parametrize(
    ("changes", "error"),
    [
        ({"secret": b""}, "haSecret"),
        ({"listen_port": 70000}, "haListenPort"),
        ({"heartbeat_interval_ms": 0}, "haSendHeartbeatInterval"),
        ({"housekeeping_interval_ms": 100}, "haHousekeepingInterval"),  # not above heartbeat
        ({"transfer_batch_size": 0}, "haTransferBatchSize"),
        ({"transfer_batch_size": 17 * 1024 * 1024}, "haTransferBatchSize"),
        ({"max_gap_not_in_sync": 0}, "haMaxGapNotInSync"),
        ({"sync_timeout_ms": 0}, "syncFlushTimeout"),
    ],
)
def test_settings_refuse_nonsense(changes: dict[str, object], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        settings(**changes)


def test_the_window_holds_the_largest_record() -> None:
    assert window_bytes(MESSAGE_BODY_SIZE_MAX) > WINDOW_BYTES + MESSAGE_BODY_SIZE_MAX


@pytest.mark.parametrize(
    ("addr", "expected"),
    [("10.0.0.7:10912", ("10.0.0.7", 10912)), ("[::1]:10912", ("::1", 10912))],
)
def test_parse_address(addr: str, expected: tuple[str, int]) -> None:
    assert parse_address(addr) == expected


@pytest.mark.parametrize("addr", ["10.0.0.7", ":10912", "host:0", "host:x", "host:70000"])
def test_parse_address_refuses(addr: str) -> None:
    with pytest.raises(ValueError, match="host:port"):
        parse_address(addr)


async def test_waiters_are_released_by_offset_and_timed_out_together() -> None:
    waiters = AckWaiters(timeout_ms=50)
    answers: list[tuple[int, int]] = []

    def answer(end: int) -> Callable[[int], None]:
        return lambda code: answers.append((end, code))

    for end in (300, 100, 200, 400):
        waiters.add(end, answer(end))
    waiters.release(99)
    assert answers == []
    waiters.release(250)
    assert answers == [(100, 0), (200, 0)]
    assert len(waiters) == 2
    done = asyncio.get_running_loop().create_future()
    waiters.add(500, lambda code: done.set_result(code))
    assert await done == ResponseCode.FLUSH_SLAVE_TIMEOUT
    timeout = ResponseCode.FLUSH_SLAVE_TIMEOUT
    assert answers[2:] == [(300, timeout), (400, timeout)]
    assert len(waiters) == 0


async def test_a_failing_waiter_does_not_stop_the_others(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    waiters = AckWaiters(timeout_ms=1000)
    answers: list[int] = []

    def broken(code: int) -> None:
        raise RuntimeError("a broken handler")

    waiters.add(10, broken)
    waiters.add(10, answers.append)
    waiters.release(10)
    assert answers == [ResponseCode.SUCCESS]
    assert "ack waiter" in caplog.text
    waiters.add(20, answers.append)
    waiters.fail_all(ResponseCode.SLAVE_NOT_AVAILABLE)
    assert answers[-1] == ResponseCode.SLAVE_NOT_AVAILABLE


class _End(int):
    """An end offset that counts the comparisons made with it (AckWaiters' work)."""

    compared = 0

    def __le__(self, other: object) -> bool:
        _End.compared += 1
        return int(self) <= other  # type: ignore[operator]

    def __ge__(self, other: object) -> bool:
        _End.compared += 1
        return int(self) >= other  # type: ignore[operator]

    def __lt__(self, other: object) -> bool:
        _End.compared += 1
        return int(self) < other  # type: ignore[operator]

    def __gt__(self, other: object) -> bool:
        _End.compared += 1
        return int(self) > other  # type: ignore[operator]


async def test_each_report_costs_what_it_releases_not_what_waits() -> None:
    """Many SYNC sends waiting, each report releasing a few: linear work in all, not quadratic
    (a scan per report drained 20k waiters in 2 s of loop time). A count, not a time."""
    count = 4_000
    waiters = AckWaiters(timeout_ms=60_000)
    answers: list[int] = []
    for end in range(1, count + 1):
        waiters.add(_End(end), answers.append)
    _End.compared = 0
    for acked in range(2, count + 1, 2):  # two waiters per report
        waiters.release(acked)
    assert answers == [ResponseCode.SUCCESS] * count
    assert len(waiters) == 0
    print(f"{count} waiters, {count // 2} reports: {_End.compared} comparisons")
    assert _End.compared <= 3 * count  # was about count**2 / 4


async def test_an_end_out_of_put_order_is_released_and_timed_out_correctly() -> None:
    waiters = AckWaiters(timeout_ms=100)
    answers: list[tuple[int, int]] = []

    def answer(end: int) -> Callable[[int], None]:
        return lambda code: answers.append((end, code))

    for end in (100, 300, 200, 400, 150):  # 200 and 150 arrive after larger ends
        waiters.add(end, answer(end))
    waiters.release(199)
    assert sorted(answers) == [(100, 0), (150, 0)]
    waiters.release(250)
    assert answers[-1] == (200, 0)
    assert len(waiters) == 2
    waiters.add(350, answer(350))  # below the last end again
    done = asyncio.get_running_loop().create_future()
    waiters.add(500, lambda code: done.set_result(code))
    assert await done == ResponseCode.FLUSH_SLAVE_TIMEOUT
    timeout = ResponseCode.FLUSH_SLAVE_TIMEOUT
    assert sorted(answers[3:]) == [(300, timeout), (350, timeout), (400, timeout)]
    assert len(waiters) == 0


A = ("10.0.0.1:10911", "10.0.0.1:10912")
B = ("10.0.0.2:10911", "10.0.0.2:10912")


def test_the_first_master_named_is_followed_at_once() -> None:
    choice = MasterChoice(answers_to_switch=6)
    assert choice.heard(A, following=False)
    assert choice.current == A
    assert choice.heard((A[0], None), following=True)  # no HA address: the one known
    assert choice.current == A


@pytest.mark.parametrize("order", ["AB", "BA", "AB BA", "BA AB AB BA"])
def test_two_name_servers_that_disagree_never_switch_a_following_slave(order: str) -> None:
    """Whatever order each round's two answers arrive in."""
    choice = MasterChoice(answers_to_switch=3 * 2)
    choice.heard(A, following=False)
    named = {"A": A, "B": B}
    for _ in range(20):
        for name in order.replace(" ", ""):
            assert choice.heard(named[name], following=True) == (name == "A")
    assert choice.current == A


def test_a_master_named_by_every_answer_for_the_rounds_is_taken() -> None:
    choice = MasterChoice(answers_to_switch=3 * 2)
    choice.heard(A, following=False)
    assert not any(choice.heard(B, following=True) for _ in range(5))
    assert choice.heard(B, following=True)
    assert choice.current == B


def test_a_slave_not_following_switches_at_once() -> None:
    choice = MasterChoice(answers_to_switch=6)
    choice.heard(A, following=False)
    assert choice.heard(B, following=False)
    assert choice.current == B
    assert not choice.heard(A, following=True)  # back to following B: A must be consistent
