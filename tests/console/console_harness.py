"""The console under test: a real local cluster, the real app served by uvicorn on a free
loopback port, and plain HTTP against it (urllib in a thread, so the cluster's loop runs)."""

from __future__ import annotations

import asyncio
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import uvicorn
from starlette.applications import Starlette

from tidemq import Admin, ConsumeFromWhere, MessageExt, PushConsumer
from tidemq.console.app import create_app
from tidemq.testing import LocalCluster, eventually, local_cluster
from tidemq.testing.processes import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]


def artifacts_dir() -> Path:
    """Where screenshots go: TIDEMQ_ARTIFACTS/console, else test-artifacts/console (git-ignored)."""
    base = os.environ.get("TIDEMQ_ARTIFACTS")
    path = Path(base) / "console" if base else REPO_ROOT / "test-artifacts" / "console"
    path.mkdir(parents=True, exist_ok=True)
    return path


@dataclass
class Answer:
    status: int
    text: str
    content_type: str
    headers: dict[str, str]


@dataclass
class Served:
    cluster: LocalCluster
    base_url: str

    async def get(self, path: str, **query: str) -> Answer:
        url = self.base_url + path + (("?" + urllib.parse.urlencode(query)) if query else "")
        return await asyncio.to_thread(_fetch, urllib.request.Request(url))

    async def post(
        self, path: str, headers: dict[str, str] | None = None, /, **fields: str
    ) -> Answer:
        """A POST as the console's own form sends it (Origin = the console) unless `headers`
        say otherwise; the form's token only when `fields` carry one (see `confirm`)."""
        data = urllib.parse.urlencode(fields).encode()
        sent = {"Origin": self.base_url, **(headers or {})}
        request = urllib.request.Request(
            self.base_url + path,
            data=data,
            method="POST",
            headers={k: v for k, v in sent.items() if v},
        )
        request.add_header("Content-Type", "application/x-www-form-urlencoded")
        return await asyncio.to_thread(_fetch, request)

    async def token(self, path: str, **query: str) -> str:
        """The CSRF token in the form the GET of `path` shows (as a person's browser reads it)."""
        page = await self.get(path, **query)
        found = re.search(r'name="csrf" value="([0-9a-f]+)"', page.text)
        assert found, f"no form token on {path}: {page.status} {page.text[-300:]}"
        return found.group(1)

    async def confirm(self, path: str, query: dict[str, str], **fields: str) -> Answer:
        """GET the form at `path` (with `query`), then POST `fields` with its token."""
        return await self.post(path, None, csrf=await self.token(path, **query), **fields)


def _fetch(request: urllib.request.Request) -> Answer:
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return Answer(
                response.status,
                response.read().decode(),
                response.headers["content-type"],
                {k.lower(): v for k, v in response.headers.items()},
            )
    except urllib.error.HTTPError as error:
        return Answer(
            error.code,
            error.read().decode(),
            error.headers["content-type"],
            {k.lower(): v for k, v in error.headers.items()},
        )


@asynccontextmanager
async def serve_console(cluster: LocalCluster, app: Starlette | None = None) -> AsyncIterator[str]:
    """The console app for `cluster` (or `app`), served until the block ends; yields its URL."""
    port = free_port()
    config = uvicorn.Config(
        app or create_app(cluster.namesrv_addr), host="127.0.0.1", port=port, log_level="warning"
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        await eventually(lambda: server.started or task.done(), what="uvicorn started")
        assert server.started, "uvicorn did not start"
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


@asynccontextmanager
async def console_on_cluster(root: Path) -> AsyncIterator[Served]:
    async with local_cluster(root) as cluster, serve_console(cluster) as url:
        yield Served(cluster, url)


async def consume_all(served: Served, group: str, topic: str, count: int) -> None:
    """Run a consumer of `group` until it has committed `count` messages of `topic`, then stop."""
    got: list[MessageExt] = []
    consumer = PushConsumer(
        group,
        served.cluster.namesrv_addr,
        consume_from_where=ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET,
    )
    consumer.subscribe(topic)
    consumer.register_listener(got.extend)
    await consumer.start()
    try:
        await eventually(lambda: len(got) >= count)
    finally:
        await consumer.shutdown()  # commits what it consumed


async def committed(served: Served, group: str, topic: str) -> int:
    """The sum of `group`'s committed offsets on the queues of `topic`."""
    async with Admin(served.cluster.namesrv_addr) as admin:
        stats = await admin.consume_stats(group, topic)
    return sum(max(o.consumer_offset, 0) for q, o in stats.offset_table.items() if q.topic == topic)
