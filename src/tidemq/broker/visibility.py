"""VisibilityGate: a controller-mode master shows consumers only what the sync set confirmed.

Pulls read up to `visible_end()` (the confirm offset, HAMaster.confirm_offset: every replica
of the sync set has the records below it; handlers/pull.py, store/get.py). A pull held at a
record beyond it must wake when the confirm offset passes the record, not when the record was
dispatched, so the store's dispatch notifications reach the pull hold through this gate:

    store dispatch ──▶ on_dispatch(event) ─┬ not limited: deliver(event) at once
       (log order)                         ├ limited, nothing pending, end <= confirmed: at once
                                           └ else pending: deque [(end₁, e₁) (end₂, e₂) …]
                                                              end₁ <= end₂ <= … (log order)
    HAMaster confirm listener ──▶ advance(confirm) ──▶ popleft while end <= confirm ──▶ deliver

Each record costs O(1): one append and one pop, never a scan. `confirmed` only grows (a member
that rejoins lower never hides again what consumers may have read).

Limited, the gate wants every topic, not only those with a pull held now: a pull that arrives
after a record's dispatch and finds it not yet visible is held, and only the record's event,
kept here until the confirm offset passes it, can wake it (else it would sleep its whole
suspend timeout). The pending events are the records not yet on every replica: a few
milliseconds of traffic normally, at most haMaxTimeSlaveNotCatchup's worth before the set
shrinks. Not limited (every role outside controller mode), events pass straight through and
the pull hold's own topic filter applies.

Called on the store's writer thread, which is the event loop's (the broker's single writer),
like the confirm listener: no lock.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable

from tidemq.store.types import DispatchEvent

log = logging.getLogger(__name__)


class VisibilityGate:
    """Holds dispatch events back until the confirm offset covers their records (module doc).

    Args:
        deliver: where events go (PullHoldService.on_dispatch).
        wants: the target's topic filter (PullHoldService.wants_topic), used when not limited.
        limited: a controller-mode master's; False: a plain pass-through.
    """

    __slots__ = ("_deliver", "_pending", "_wants", "confirmed", "limited")

    def __init__(
        self,
        deliver: Callable[[DispatchEvent], None],
        wants: Callable[[str], bool],
        *,
        limited: bool,
    ) -> None:
        self._deliver = deliver
        self._wants = wants
        self.limited = limited
        self.confirmed = 0
        self._pending: deque[tuple[int, DispatchEvent]] = deque()

    @property
    def pending(self) -> int:
        return len(self._pending)

    def visible_end(self) -> int:
        """The log offset records must end at or below to be served (PullHandler)."""
        return self.confirmed

    def wants_topic(self, topic: str) -> bool:
        """The store's topic filter for `on_dispatch` (every topic when limited: module doc)."""
        return self.limited or self._wants(topic)

    def on_dispatch(self, event: DispatchEvent) -> None:
        """The store's dispatch listener."""
        if not self.limited:
            self._deliver(event)
            return
        end = event.physical_offset + event.size
        if not self._pending and end <= self.confirmed:
            self._deliver(event)
        else:
            self._pending.append((end, event))

    def advance(self, confirm: int) -> None:
        """HAMaster's confirm listener: deliver, in order, the events `confirm` covers."""
        if confirm <= self.confirmed:
            return
        self.confirmed = confirm
        pending = self._pending
        while pending and pending[0][0] <= confirm:
            event = pending.popleft()[1]
            try:
                self._deliver(event)
            except Exception:  # one failing delivery must not keep the others back
                log.exception(
                    "visibility gate: delivering %s/%d failed", event.topic, event.queue_id
                )
