"""Which broker of a group answers a read: pulls, offset commits and offset queries.

A broker group is every broker with one broker name: the master (broker id 0) and its slaves
(ids 1, 2, ...), all listed in the route's `brokerAddrs`. Writes (sends, send-backs,
END_TRANSACTION) and queue locks go to the master only, as in RocketMQ 4.x, whose slaves refuse
them. Reads may go to a slave, which serves pulls and offsets from its replica (spec ha.md §1):

    read of a queue of broker name B, preferred id p (the queue's suggestion, else 0)
      candidates in order: p if the route lists it, then the master, then slaves by id
      → the first candidate the read fault tracker does not skip
      → every candidate skipped: the first one (fault avoidance reduces choice, never
        availability: a broker skipped in error still gets the read)

Upstream's Java client has the same order (MQClientInstance.findBrokerAddressInSubscribe for
pulls, findBrokerAddressInAdmin for offsets): the suggested id, else any address, the master
first. It has no fault tracker for reads, so while a master is still in the route but down,
every pull waits for a timeout or a refused connect until the name servers drop it. TideMQ
records such transport failures per address in a `FaultTracker` (client/fault.py) and reads
from the slave at once; the failed master is probed every PROBE_INTERVAL_MS with a heartbeat
(client/fault_probe.py) and, once it answers, reads return to it. A master that a route update
dropped is probed the same way: once it answers, the routes are refreshed at once, so reads
return to it in about a second, not at the next 30 s route refresh (and, while a route still
lacks it, again with back-off: client/rejoin.py). Only transport failures
count (no answer, refused connect, closed connection): a broker that answers with an error code
is alive. A probe's answer time is not charged (as a read's is not): a master that answers is
read from again, however slowly it answered.

Offset commits are the exception to the fault tracker: they go to the master whenever the route
lists it (`commit_target`; a slave only when that request fails, `fallback`), since an offset a
slave holds is replaced by the master's older copy at the slave's next metadata sync.

`PullSuggestions` is upstream's pullFromWhichNodeTable: every pull answer carries
`suggestWhichBrokerId` (a master with slaveReadEnable steers a lagging consumer to slave 1; a
slave steers it back to 0), remembered per queue for that queue's next pull. A pull that goes to
a slave has its COMMIT_OFFSET flag cleared (as upstream): a slave does not take offsets from a
pull; the consumer's explicit commit reaches it instead.

The rule (`read_order`, `choose_read`) is pure and tested exhaustively; `ReadRouter` applies it
with the injected clock and owns the prober's task.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from tidemq.clock import Clock
from tidemq.errors import NoRouteError
from tidemq.protocol.bodies import MessageQueue

from .fault import FaultTracker
from .fault_probe import BrokerProber
from .route_cache import MASTER_ID, RouteCache


@dataclass(frozen=True, slots=True)
class BrokerTarget:
    """One broker of a group, chosen for a request."""

    broker_name: str
    broker_id: int
    addr: str

    @property
    def is_slave(self) -> bool:
        return self.broker_id != MASTER_ID


def read_order(addrs: Mapping[int, str], preferred_id: int = MASTER_ID) -> list[int]:
    """The broker ids of `addrs` in the order a read tries them: `preferred_id` if listed, the
    master, then the slaves by id (module docstring)."""
    order = [preferred_id] if preferred_id in addrs else []
    if MASTER_ID in addrs and preferred_id != MASTER_ID:
        order.append(MASTER_ID)
    order.extend(sorted(i for i in addrs if i not in (preferred_id, MASTER_ID)))
    return order


def choose_read(
    addrs: Mapping[int, str], preferred_id: int, is_available: Callable[[str], bool]
) -> int | None:
    """The broker id a read goes to (None when `addrs` is empty)."""
    order = read_order(addrs, preferred_id)
    for broker_id in order:
        if is_available(addrs[broker_id]):
            return broker_id
    return order[0] if order else None


class ReadRouter:
    """Chooses the broker for each read and remembers which addresses failed.

    `probe(addr, timeout_ms)` asks a skipped address whether it answers again (the instance
    passes a heartbeat); it returns when it did and raises a QueueError when it did not."""

    def __init__(
        self, routes: RouteCache, clock: Clock, probe: Callable[[str, float], Awaitable[None]]
    ) -> None:
        self._routes = routes
        self._clock = clock
        self.faults = FaultTracker(on_failure=lambda addr: self._prober.wake(addr))
        # A probe's answer time is not charged either (as `record`): a master that answers its
        # first probe slowly (a restart warming up) is read from again at once, not skipped for
        # the send path's 30 s with no further probe.
        self._prober = BrokerProber(
            self.faults, probe, clock, rotation="read", charge_latency=False
        )

    def target(self, broker_name: str, preferred_id: int = MASTER_ID) -> BrokerTarget:
        """The broker of `broker_name` a read goes to.

        Raises:
            NoRouteError: no cached route names that broker.
        """
        addrs = self._routes.addresses(broker_name)
        now_ms = self._clock.monotonic_ms()
        broker_id = choose_read(
            addrs, preferred_id, lambda addr: self.faults.is_available(addr, now_ms)
        )
        if broker_id is None:
            raise NoRouteError(f"no address known for broker {broker_name!r}")
        return BrokerTarget(broker_name, broker_id, addrs[broker_id])

    def commit_target(self, broker_name: str) -> BrokerTarget:
        """The broker an offset commit goes to first: the master whenever the route lists it,
        whatever the fault tracker says (upstream's findBrokerAddressInAdmin). A master skipped
        for reads after one transport error is most likely healthy, and an offset stored in a
        slave is overwritten by the master's copy within about a second; so a commit tries the
        master and falls back to a slave (`fallback`) only when that request fails. Without a
        master in the route: as a read.

        Raises:
            NoRouteError: no cached route names that broker.
        """
        master = self._routes.addresses(broker_name).get(MASTER_ID)
        if master is None:
            return self.target(broker_name)
        return BrokerTarget(broker_name, MASTER_ID, master)

    def fallback(self, failed: BrokerTarget) -> BrokerTarget | None:
        """After a transport failure of `failed`: the broker of its group a retry goes to (read
        order, without `failed`), or None when the group has no other."""
        addrs = {
            broker_id: addr
            for broker_id, addr in self._routes.addresses(failed.broker_name).items()
            if addr != failed.addr
        }
        now_ms = self._clock.monotonic_ms()
        broker_id = choose_read(
            addrs, MASTER_ID, lambda addr: self.faults.is_available(addr, now_ms)
        )
        if broker_id is None:
            return None
        return BrokerTarget(failed.broker_name, broker_id, addrs[broker_id])

    def watch_lost_masters(self, before: Mapping[str, str]) -> None:
        """After a route update: a master of `before` (broker name → address) that the routes no
        longer list is probed like a failed one, so that once it answers again the routes are
        refreshed at once (the instance's probe does) and reads return to it within about a
        probe interval rather than at the next 30 s route refresh."""
        now_ms = self._clock.monotonic_ms()
        for broker_name, addr in before.items():
            if self._routes.master_address(broker_name) is None:
                self.faults.record(addr, 0.0, now_ms, failed=True)

    def record(self, target: BrokerTarget, *, failed: bool) -> None:
        """Charge one request to `target.addr`: a transport failure skips the address (probed
        until it answers); an answer clears its record."""
        now_ms = self._clock.monotonic_ms()
        # Latency is not charged: a long-polling pull is slow by design, not a slow broker.
        self.faults.record(target.addr, 0.0, now_ms, failed=failed)

    async def stop(self) -> None:
        await self._prober.stop()


class PullSuggestions:
    """The broker id each queue's next pull prefers: the last answer's suggestWhichBrokerId
    (upstream's pullFromWhichNodeTable). A queue never pulled prefers the master."""

    def __init__(self) -> None:
        self._by_queue: dict[MessageQueue, int] = {}

    def get(self, mq: MessageQueue) -> int:
        return self._by_queue.get(mq, MASTER_ID)

    def update(self, mq: MessageQueue, broker_id: int) -> None:
        if broker_id == MASTER_ID:
            self._by_queue.pop(mq, None)
        else:
            self._by_queue[mq] = broker_id

    def forget(self, mq: MessageQueue) -> None:
        self._by_queue.pop(mq, None)
