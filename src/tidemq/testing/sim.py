"""Deterministic simulation primitives: a scheduler on a FakeClock and a lossy, delaying network.

Shipped for tests (TigerBeetle's VOPR, FoundationDB's simulation): everything that would be
concurrent in a real cluster is an event on one heap, ordered by (due time, sequence number), and
every random choice comes from one `random.Random(seed)`, so a seed replays a run exactly.

    SimScheduler.at(t, action) ──▶ heap ──▶ run_until(t_end): pop, advance the FakeClock to the
                                             event's time, run the action (sync or async)
    SimNetwork.send(deliver)   ──▶ dropped with loss_probability, else scheduled after a delay
                                   drawn from [delay_ms_min, delay_ms_max]
    SimConnection              ──▶ what the broker's CheckBackService sees of a producer: a
                                   `closed` flag and `oneway(command)` over the SimNetwork

Sim time is the FakeClock's monotonic milliseconds; the wall clock (store timestamps) moves with
it. No event runs concurrently with another; an async action is awaited before the next one.
"""

from __future__ import annotations

import heapq
import inspect
import itertools
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Final

from tidemq.clock import FakeClock
from tidemq.errors import ConnectionClosedError
from tidemq.protocol.frame import RemotingCommand

Action = Callable[[], Awaitable[None] | None]

# A runaway simulation (an action that keeps scheduling at the same instant) stops here.
SIM_EVENTS_MAX: Final = 5_000_000


@dataclass(order=True)
class _Event:
    due_ms: float
    sequence: int
    action: Action = field(compare=False)


class SimScheduler:
    """Runs actions in due-time order on `clock`, which it alone advances."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self._heap: list[_Event] = []
        self._sequence = itertools.count()
        self.events_run = 0

    @property
    def now_ms(self) -> float:
        return self.clock.monotonic_ms()

    @property
    def pending(self) -> int:
        return len(self._heap)

    def at(self, due_ms: float, action: Action) -> None:
        """Run `action` at sim time `due_ms` (now, if that is in the past)."""
        heapq.heappush(self._heap, _Event(max(due_ms, self.now_ms), next(self._sequence), action))

    def after(self, delay_ms: float, action: Action) -> None:
        assert delay_ms >= 0, delay_ms
        self.at(self.now_ms + delay_ms, action)

    def every(self, interval_ms: float, action: Action) -> None:
        """Run `action` every `interval_ms`, first one interval from now, for ever."""
        assert interval_ms > 0, interval_ms

        async def tick() -> None:
            self.after(interval_ms, tick)
            result = action()
            if inspect.isawaitable(result):
                await result

        self.after(interval_ms, tick)

    async def run_until(self, end_ms: float) -> None:
        """Run every event due at or before `end_ms`; the clock ends at `end_ms`."""
        while self._heap and self._heap[0].due_ms <= end_ms:
            event = heapq.heappop(self._heap)
            self._advance_to(event.due_ms)
            self.events_run += 1
            assert self.events_run <= SIM_EVENTS_MAX, "simulation runaway"
            result = event.action()
            if inspect.isawaitable(result):
                await result
        self._advance_to(end_ms)

    def _advance_to(self, time_ms: float) -> None:
        if time_ms > self.now_ms:
            self.clock.advance(time_ms - self.now_ms)


@dataclass(frozen=True, slots=True, kw_only=True)
class NetworkConfig:
    delay_ms_min: float = 1.0
    delay_ms_max: float = 30.0
    loss_probability: float = 0.1

    def __post_init__(self) -> None:
        assert 0 <= self.delay_ms_min <= self.delay_ms_max, self
        assert 0.0 <= self.loss_probability < 1.0, self


@dataclass(slots=True)
class NetworkStats:
    sent: int = 0
    dropped: int = 0


class SimNetwork:
    """Delivers frames after a random delay, or loses them. Order between two frames is not kept
    (as with two connections, or a reconnect); the receiver decides whether it is still there."""

    def __init__(self, scheduler: SimScheduler, rng: random.Random, config: NetworkConfig) -> None:
        self.scheduler = scheduler
        self.config = config
        self._rng = rng
        self.stats = NetworkStats()

    def send(self, deliver: Action) -> bool:
        """Schedule `deliver`; False when the frame is lost (the sender does not learn it)."""
        self.stats.sent += 1
        if self._rng.random() < self.config.loss_probability:
            self.stats.dropped += 1
            return False
        delay_ms = self._rng.uniform(self.config.delay_ms_min, self.config.delay_ms_max)
        self.scheduler.after(delay_ms, deliver)
        return True


CommandSink = Callable[[RemotingCommand], Awaitable[None] | None]


class SimConnection:
    """A broker's view of one client connection, over the SimNetwork.

    Duck-types the part of `remoting.Connection` that server-initiated requests use (`closed`,
    `oneway`). `close()` is a reset the broker notices (writes raise); a peer that died without
    a reset keeps the connection open and silently swallows what it is sent.
    """

    def __init__(self, network: SimNetwork, sink: CommandSink, name: str) -> None:
        self._network = network
        self._sink = sink
        self.name = name
        self.peer_text = name
        self.closed = False

    def __repr__(self) -> str:
        return f"SimConnection({self.name})"

    def close(self) -> None:
        self.closed = True

    async def oneway(self, command: RemotingCommand) -> None:
        if self.closed:
            raise ConnectionClosedError(f"{self.name} is closed")
        sink = self._sink

        def deliver() -> Awaitable[None] | None:
            return sink(command)

        self._network.send(deliver)
