"""EtcdSession against a real etcd: CAS, create-if-absent, leases, watches across a restart."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest

from tidemq.controller.etcd import RESYNC, EtcdSession, Notice, parse_endpoints
from tidemq.controller.state import ControllerError, EtcdUnavailable
from tidemq.testing import eventually, eventually_async
from tidemq.testing.etcd import EtcdProcess
from tidemq.testing.processes import free_port

pytestmark = pytest.mark.etcd


async def test_create_if_absent_wins_once(session: EtcdSession) -> None:
    assert await session.get("/t/k") is None
    assert await session.cas("/t/k", b"one", 0)
    assert not await session.cas("/t/k", b"two", 0)
    got = await session.get("/t/k")
    assert got is not None
    assert got.value == b"one"
    assert got.version == 1


async def test_cas_of_two_from_one_read_wins_once(session: EtcdSession) -> None:
    await session.put("/t/k", b"v0")
    read = await session.get("/t/k")
    assert read is not None
    results = await asyncio.gather(
        session.cas("/t/k", b"a", read.mod_revision), session.cas("/t/k", b"b", read.mod_revision)
    )
    assert sorted(results) == [False, True]
    got = await session.get("/t/k")
    assert got is not None
    assert got.value == (b"a" if results[0] else b"b")
    assert got.mod_revision > read.mod_revision
    # A CAS from a stale read loses.
    assert not await session.cas("/t/k", b"c", read.mod_revision)


async def test_get_prefix_and_delete(session: EtcdSession) -> None:
    await session.put("/t/p/1", b"x")
    await session.put("/t/p/2", b"y")
    await session.put("/t/q", b"z")
    assert {k: v.value for k, v in (await session.get_prefix("/t/p/")).items()} == {
        "/t/p/1": b"x",
        "/t/p/2": b"y",
    }
    assert await session.delete("/t/p/1")
    assert not await session.delete("/t/p/1")
    assert list(await session.get_prefix("/t/p/")) == ["/t/p/2"]


async def test_get_prefix_reads_past_a_key_that_is_not_utf8(session: EtcdSession) -> None:
    await session.put("/t/p/1", b"x")
    raw_put = session._call("raw put", lambda c: c.put(b"/t/p/\xff", b"y"))
    await raw_put
    got = {k: v.value for k, v in (await session.get_prefix("/t/p/")).items()}
    assert got == {"/t/p/1": b"x", "/t/p/\ufffd": b"y"}


async def test_lease_expiry_removes_its_key(session: EtcdSession) -> None:
    lease = await session.grant_lease(1)
    await session.put("/t/alive/1", b"x", lease=lease)
    assert await session.keep_alive_once(lease) is not None

    async def gone() -> bool:
        return await session.get("/t/alive/1") is None

    await eventually_async(gone, 10.0, what="the key on the expired lease is gone")
    assert await session.keep_alive_once(lease) is None


async def test_revoke_removes_the_key_at_once_and_tolerates_a_gone_lease(
    session: EtcdSession,
) -> None:
    lease = await session.grant_lease(30)
    await session.put("/t/alive/2", b"x", lease=lease)
    await session.revoke(lease)
    assert await session.get("/t/alive/2") is None
    await session.revoke(lease)


async def test_calls_to_a_dead_etcd_raise_etcd_unavailable_in_bounded_time() -> None:
    session = EtcdSession(f"127.0.0.1:{free_port()}", call_timeout_s=0.5)
    try:
        async with asyncio.timeout(5):
            with pytest.raises(EtcdUnavailable):
                await session.get("/t/k")
            with pytest.raises(EtcdUnavailable):
                await session.connect()
    finally:
        await session.close()


async def test_session_moves_to_the_endpoint_that_answers(etcd: EtcdProcess) -> None:
    dead = f"127.0.0.1:{free_port()}"
    session = EtcdSession(f"{dead};{etcd.endpoint}", call_timeout_s=0.5)
    try:
        await session.connect()
        assert session.endpoint == etcd.endpoint
        await session.put("/t/k", b"v")
    finally:
        await session.close()


def test_parse_endpoints() -> None:
    assert parse_endpoints("a:1; b:2;") == ["a:1", "b:2"]
    with pytest.raises(ControllerError):
        parse_endpoints("")
    with pytest.raises(ControllerError):
        parse_endpoints("nohost")


@contextlib.asynccontextmanager
async def collecting(session: EtcdSession, prefix: str) -> AsyncIterator[list[Notice]]:
    seen: list[Notice] = []

    async def collect() -> None:
        async for notice in session.watch_prefix(prefix):
            seen.append(notice)

    task = asyncio.create_task(collect())
    try:
        yield seen
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _puts(seen: list[Notice]) -> list[tuple[str, bytes]]:
    return [(n.key, n.value) for n in seen if n.kind == "put"]


async def test_watch_sees_changes_and_survives_an_etcd_restart(
    etcd: EtcdProcess, session: EtcdSession
) -> None:
    async with collecting(session, "/t/w/") as seen:
        await eventually(lambda: seen == [RESYNC], what="the watch is established")
        await session.put("/t/w/a", b"1")
        await session.put("/t/other", b"x")
        await session.delete("/t/w/a")
        await eventually(lambda: len(seen) == 3, what="a put and a delete seen")
        assert _puts(seen) == [("/t/w/a", b"1")]
        assert seen[2].kind == "delete"
        assert seen[2].key == "/t/w/a"

        await etcd.restart()
        await eventually(lambda: seen.count(RESYNC) == 2, 15.0, what="re-watched after restart")

        async def put_again() -> bool:
            try:
                await session.put("/t/w/b", b"2")
            except EtcdUnavailable:
                return False
            return True

        await eventually_async(put_again, 15.0, what="etcd answers again")
        await eventually(lambda: ("/t/w/b", b"2") in _puts(seen), what="a put after the restart")
