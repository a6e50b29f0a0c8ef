"""EtcdSession: the few etcd v3 calls the controller needs, each bounded and failing one way.

    EtcdSession ──> endpoint[i] (aetcd.Client, one gRPC channel each, made on first use;
        │            each watch has a channel of its own)
        │  a call that fails or times out: EtcdUnavailable, and the next call goes to
        │  endpoint[i+1] (round robin); a call is never retried here
        └─ watch_prefix: a pump task per watch feeds a queue; after an error (or when the
           session moved to another endpoint) it re-watches with back-off and yields RESYNC

Why no retry inside a call: a CAS whose answer was lost may have been applied; retrying it would
report "lost" for a CAS that won. The caller re-reads the state instead, which shows either.

Why every call carries a deadline: a paused or partitioned etcd answers nothing, and a master
must learn in bounded time that it can no longer renew its lease (lease.py).

aetcd is untyped: every Any stays in this module; callers see str, bytes, int and the small
tuples below.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple, TypeVar

import aetcd

from tidemq.controller.state import ControllerError, EtcdUnavailable

__all__ = ["EtcdSession", "EtcdUnavailable", "Notice", "Versioned"]

log = logging.getLogger(__name__)

CALL_TIMEOUT_S: Final = 2.0
WATCH_BACKOFF_S_MIN: Final = 0.05
WATCH_BACKOFF_S_MAX: Final = 1.0
# How often a quiet watch checks that the session still uses the endpoint it watches on.
WATCH_CHECK_S: Final = 0.5
# gRPC's own reconnect back-off grows to 120 s by default; a restarted etcd must be found again
# within a lease TTL. Keep-alive pings find a silent peer (paused, partitioned) for the watch
# stream, which has no deadline; etcd refuses pings more often than every 5 s.
CHANNEL_OPTIONS: Final = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": 100,
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.keepalive_time_ms": 5000,
    "grpc.keepalive_timeout_ms": 2000,
    "grpc.keepalive_permit_without_calls": 1,
    "grpc.http2.max_pings_without_data": 0,
}

T = TypeVar("T")


class Versioned(NamedTuple):
    """A key's value and the revisions a CAS compares against."""

    value: bytes
    mod_revision: int
    version: int


@dataclass(frozen=True, slots=True)
class Notice:
    """A change under a watched prefix. RESYNC: the watch was (re-)established and changes may
    have been missed, so the caller re-reads what it cares about."""

    kind: Literal["put", "delete", "resync"]
    key: str = ""
    value: bytes = b""
    mod_revision: int = 0


RESYNC: Final = Notice("resync")


def parse_endpoints(endpoints: str | Sequence[str]) -> list[str]:
    """Endpoints as broker.conf gives them ("host:port;host:port") or as a list."""
    items = endpoints.split(";") if isinstance(endpoints, str) else list(endpoints)
    parsed = [item.strip() for item in items if item.strip()]
    for item in parsed:
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ControllerError(f"bad etcd endpoint {item!r} (host:port)")
    if not parsed:
        raise ControllerError("no etcd endpoint given")
    return parsed


class EtcdSession:
    """The controller's connection to etcd: endpoints tried in turn, calls bounded."""

    def __init__(
        self, endpoints: str | Sequence[str], *, call_timeout_s: float = CALL_TIMEOUT_S
    ) -> None:
        self.endpoints = parse_endpoints(endpoints)
        self.call_timeout_s = call_timeout_s
        self._clients: dict[int, Any] = {}
        self._current = 0
        self._closed = False

    @property
    def endpoint(self) -> str:
        """The endpoint the next call goes to."""
        return self.endpoints[self._current]

    def _new_client(self, index: int) -> Any:
        host, _, port = self.endpoints[index].rpartition(":")
        return aetcd.Client(
            host=host, port=int(port), timeout=self.call_timeout_s, options=CHANNEL_OPTIONS
        )

    def _client(self) -> Any:
        index = self._current
        client = self._clients.get(index)
        if client is None:
            client = self._clients[index] = self._new_client(index)
        return client

    async def connect(self) -> None:
        """Use the first endpoint that answers (each tried once, bounded by the call timeout).

        Raises:
            EtcdUnavailable: none answered.
        """
        errors = []
        for _ in self.endpoints:
            try:
                await self._call("probe", lambda c: c.get(b"\0"))
                return
            except EtcdUnavailable as e:
                errors.append(str(e))
        raise EtcdUnavailable(f"no etcd endpoint answers: {'; '.join(errors)}")

    async def close(self) -> None:
        self._closed = True
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await self._close_client(client)

    async def _close_client(self, client: Any) -> None:
        # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation that
        # arrives as the inner call completes, and a stopping member would never stop.
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self.call_timeout_s):
                await client.close()

    async def _call(self, what: str, call: Callable[[Any], Awaitable[T]]) -> T:
        """Run one call on the current endpoint; on any failure move on and raise."""
        if self._closed:
            raise EtcdUnavailable("the etcd session is closed")
        index = self._current
        endpoint = self.endpoints[index]
        try:
            async with asyncio.timeout(self.call_timeout_s):
                return await call(self._client())
        except (TimeoutError, aetcd.ClientError) as e:
            if self._current == index:
                # Another task may already have moved on after a failure of its own.
                self._current = (index + 1) % len(self.endpoints)
            raise EtcdUnavailable(f"etcd {endpoint}: {what} failed: {e!r}") from e

    async def grant_lease(self, ttl_s: int) -> int:
        lease = await self._call("lease grant", lambda c: c.lease(ttl_s))
        return int(lease.id)

    async def keep_alive_once(self, lease_id: int) -> float | None:
        """Renew the lease once; its remaining TTL in seconds, or None when etcd has no such
        lease (expired or revoked): then keys on it are gone."""
        reply = await self._call("lease keep-alive", lambda c: c.refresh_lease(lease_id))
        if reply is None or reply.TTL <= 0:
            return None
        return float(reply.TTL)

    async def revoke(self, lease_id: int) -> None:
        """Revoke the lease (its keys go at once); a lease already gone is not an error."""

        async def revoke(client: Any) -> None:
            try:
                await client.revoke_lease(lease_id)
            except aetcd.ClientError as e:
                if "not found" not in str(e):
                    raise

        await self._call("lease revoke", revoke)

    async def get(self, key: str) -> Versioned | None:
        got = await self._call("get", lambda c: c.get(key.encode()))
        if got is None:
            return None
        return Versioned(bytes(got.value), int(got.mod_revision), int(got.version))

    async def get_prefix(self, prefix: str) -> dict[str, Versioned]:
        """Every key under `prefix`. Keys are decoded with errors="replace" and an entry that
        cannot be read is skipped alone: one stray key must not hide the others."""
        got = await self._call("get prefix", lambda c: c.get_prefix(prefix.encode()))
        found: dict[str, Versioned] = {}
        for kv in got.kvs:
            try:
                key = bytes(kv.key).decode(errors="replace")
                found[key] = Versioned(bytes(kv.value), int(kv.mod_revision), int(kv.version))
            except (TypeError, ValueError) as e:
                log.warning("etcd entry under %s skipped: %r", prefix, e)
        return found

    async def cas(self, key: str, value: bytes, mod_revision: int) -> bool:
        """Put `value` only if the key is unchanged since it was read at `mod_revision`
        (0: only if the key does not exist). False: someone else changed it first."""

        async def txn(client: Any) -> bool:
            ops = client.transactions
            raw = key.encode()
            compare = ops.mod(raw) == mod_revision if mod_revision else ops.version(raw) == 0
            succeeded, _ = await client.transaction([compare], [ops.put(raw, value)], [])
            return bool(succeeded)

        return await self._call("cas", txn)

    async def put(self, key: str, value: bytes, lease: int | None = None) -> None:
        await self._call("put", lambda c: c.put(key.encode(), value, lease=lease))

    async def delete(self, key: str) -> bool:
        deleted = await self._call("delete", lambda c: c.delete(key.encode()))
        return deleted is not None

    async def watch_prefix(self, prefix: str) -> AsyncIterator[Notice]:
        """Changes under `prefix`, forever. Each time the watch is (re-)established, RESYNC comes
        first: the caller reads after it, so no change between its read and the watch is lost."""
        backoff_s = WATCH_BACKOFF_S_MIN
        while not self._closed:
            index = self._current
            queue: asyncio.Queue[Notice | BaseException | None] = asyncio.Queue()
            # A channel of its own per watch, closed when the watch ends: whatever state a
            # broken stream left in aetcd's Watcher goes with it, and a hung stream cannot
            # outlive its watch.
            client = self._new_client(index)
            try:
                watch = await self._call("watch", functools.partial(_start_watch, client, prefix))
            except EtcdUnavailable as e:
                log.info("etcd watch on %s not established: %s", prefix, e)
                await self._close_client(client)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, WATCH_BACKOFF_S_MAX)
                continue
            pump = asyncio.create_task(_pump(watch, queue), name=f"etcd-watch {prefix}")
            try:
                yield RESYNC
                backoff_s = WATCH_BACKOFF_S_MIN
                async for notice in self._drain(queue, index):
                    yield notice
            finally:
                pump.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await pump
                await self._close_client(client)
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, WATCH_BACKOFF_S_MAX)

    async def _drain(
        self, queue: asyncio.Queue[Notice | BaseException | None], index: int
    ) -> AsyncIterator[Notice]:
        """The pump's notices until it fails or the session moves to another endpoint."""
        while not self._closed:
            try:
                async with asyncio.timeout(WATCH_CHECK_S):
                    item = await queue.get()
            except TimeoutError:
                if self._current != index:
                    log.info("etcd watch moves to %s", self.endpoint)
                    return
                continue
            if item is None or isinstance(item, BaseException):
                log.info("etcd watch on %s broke: %r; watching again", self.endpoints[index], item)
                if self._current == index:
                    self._current = (index + 1) % len(self.endpoints)
                return
            yield item


async def _start_watch(client: Any, prefix: str, _current: Any) -> Any:
    return await client.watch_prefix(prefix.encode())


async def _pump(watch: Any, queue: asyncio.Queue[Notice | BaseException | None]) -> None:
    try:
        async for event in watch:
            kind: Literal["put", "delete"] = "put" if event.kind == "PUT" else "delete"
            kv = event.kv
            key = bytes(kv.key).decode(errors="replace")
            notice = Notice(kind, key, bytes(kv.value), int(kv.mod_revision))
            queue.put_nowait(notice)
    except asyncio.CancelledError:
        raise
    except Exception as e:
        queue.put_nowait(e)
        return
    queue.put_nowait(None)
