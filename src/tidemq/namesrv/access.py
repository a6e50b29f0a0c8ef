"""The name server's ACL (`tidemq namesrv --acl-file`): who may change routes, and who may read
them.

A rogue process that can reach the name server could otherwise REGISTER_BROKER a topic's
route onto itself, or keep a dead broker in the routes with QUERY_DATA_VERSION (it refreshes
the broker's liveness). With an ACL file, those two, UNREGISTER_BROKER and every other code
that writes (KV writes, topic deletion, write-permission changes) need a valid signature of an
admin account (global white-listed addresses excepted, as on a broker); route, cluster,
topic-list and KV reads need a valid signature of any account, since the lists name every
topic (security/resources.py NAMESRV_POLICY). A refused registration is answered and changes
nothing: the broker never appears in a route.

The file is reloaded when it changes, polled every ACL_RELOAD_INTERVAL_MS.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from tidemq.remoting import RequestHook
from tidemq.remoting.handlers import refusing_hook
from tidemq.security.acl import ACL_RELOAD_INTERVAL_MS, load_authorizer
from tidemq.security.resources import NAMESRV_POLICY

logger = logging.getLogger(__name__)


class NamesrvAcl:
    """The Authorizer over the ACL file, its request hook and its reload task.

    Raises (constructor):
        AclFileError: the file cannot be read or is not a valid ACL file.
    """

    name = "namesrv-acl-reload"

    def __init__(self, path: Path) -> None:
        self.authorizer, self.watcher = load_authorizer(path, NAMESRV_POLICY)
        self._task: asyncio.Task[None] | None = None
        self.hook: RequestHook = refusing_hook(self.authorizer.check, "ACL")
        logger.info("ACL on: %d accounts from %s", len(self.authorizer.table.accounts), path)

    async def start(self) -> None:
        assert self._task is None, "already started"
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(ACL_RELOAD_INTERVAL_MS / 1000)
            try:
                self.watcher.poll()
            except Exception:
                # A task boundary: one failed poll must not end reloading for good.
                logger.exception("%s: poll failed", self.name)
