"""remoting.eager: a coroutine started inside the read callback and finished as a task."""

from __future__ import annotations

import asyncio

import pytest

from tidemq.remoting.eager import resume


async def test_resume_finishes_the_coroutine_with_the_awaited_value() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    seen: list[int] = []

    async def handler() -> None:
        seen.append(await future)

    coroutine = handler()
    awaited = coroutine.send(None)  # the eager first step, as Connection does it
    task = asyncio.ensure_future(resume(coroutine, awaited))
    future.set_result(7)
    await task
    assert seen == [7]


async def test_resume_forwards_a_cancellation_into_the_coroutine() -> None:
    future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    cleaned: list[str] = []

    async def handler() -> None:
        try:
            await future
        finally:
            cleaned.append("finally")

    coroutine = handler()
    task = asyncio.ensure_future(resume(coroutine, coroutine.send(None)))
    await asyncio.sleep(0)  # let the task take its first step
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned == ["finally"]


def test_closing_the_task_body_after_the_coroutine_was_closed_is_quiet() -> None:
    # At loop teardown the garbage collector may close the inner coroutine before the task's.
    loop = asyncio.new_event_loop()
    try:
        future: asyncio.Future[None] = loop.create_future()

        async def handler() -> None:
            await future

        coroutine = handler()
        awaited = coroutine.send(None)
        body = resume(coroutine, awaited)
        assert body.send(None) is awaited
        coroutine.close()
        body.close()  # raised "cannot reuse already awaited coroutine" before
    finally:
        loop.close()


def test_closing_the_task_body_closes_the_suspended_coroutine() -> None:
    loop = asyncio.new_event_loop()
    try:
        future: asyncio.Future[None] = loop.create_future()
        closed: list[bool] = []

        async def handler() -> None:
            try:
                await future
            except GeneratorExit:
                closed.append(True)
                raise

        coroutine = handler()
        body = resume(coroutine, coroutine.send(None))
        body.send(None)
        body.close()
        assert closed == [True]
    finally:
        loop.close()
