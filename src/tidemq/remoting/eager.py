"""Eager start of inbound requests: a handler runs at once, inside the read callback.

Most requests (a send, an offset commit) finish without awaiting, so they need no task and no
extra loop iteration; only one that suspends becomes a task, resumed where it stopped (what
Python 3.12's eager task factory does). `Connection._on_request` sends the first step itself and
hands a suspended coroutine to `resume`.
"""

from __future__ import annotations

import types
from collections.abc import Coroutine, Generator
from typing import Any


async def resume(coroutine: Coroutine[Any, Any, None], awaited: Any) -> None:
    """Finish `coroutine`, started eagerly and suspended on `awaited`, as this task's body."""
    await _drive(coroutine, awaited)


@types.coroutine
def _drive(coroutine: Coroutine[Any, Any, None], awaited: Any) -> Generator[Any, Any, None]:
    # Passes what the coroutine awaits up to the task, and the task's answers (values, thrown
    # exceptions such as a cancellation) down into it, as `await` would have.
    while True:
        try:
            sent = yield awaited
        except GeneratorExit:
            # This task is being destroyed (e.g. at loop teardown, where the garbage collector
            # may already have closed the inner coroutine): close it too, which is a no-op if so.
            coroutine.close()
            raise
        except BaseException as exc:  # forwarded into the coroutine, not handled here
            try:
                awaited = coroutine.throw(exc)
            except StopIteration:
                return
        else:
            try:
                awaited = coroutine.send(sent)
            except StopIteration:
                return
