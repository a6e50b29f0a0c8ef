"""One live broker per store (issue 11, item 2).

A second broker on a live store used to "recover" it, append over the live broker's records and,
on its clean stop, delete the live broker's `abort` marker. Now the store is flock'd at start
(store/lock.py) and a second one is refused with one line naming the directory and the holder's
pid, before anything is read or changed. The process tests run real `tidemq broker` processes:
the lock must hold across processes, and the refusal must be what an operator sees.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Final

import pytest
from store_helpers import Opener, bodies, message

from tidemq.client.admin import Admin
from tidemq.client.message import Message
from tidemq.client.producer import Producer
from tidemq.store import FileMessageStore
from tidemq.store.lock import LOCK_FILE_NAME, StoreLockedError, holder_pid
from tidemq.store.tools import verify
from tidemq.testing import eventually_async
from tidemq.testing.processes import free_broker_port, process_cluster

TOPIC: Final = "StoreLockTopic"
# Python start-up and the refusal, on a loaded 2-core machine; a second broker that is not
# refused keeps running, so this is also how long the test waits before calling it a failure.
REFUSAL_TIMEOUT_S: Final = 30.0
SENDS: Final = 20


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every file of a store (the small ones whole, segments by size and head)."""
    return {
        str(path.relative_to(root)): path.read_bytes()[:4096]
        for path in sorted(root.rglob("*"))
        if path.is_file() and path.name != LOCK_FILE_NAME
    }


def test_a_second_store_on_a_live_directory_is_refused_untouched(opener: Opener) -> None:
    live = opener.open()
    assert live.put_message(message(0)).ok
    live.flush()
    root = live.config.root_dir
    before = _snapshot(root)
    second = FileMessageStore(live.config, opener.clock)
    with pytest.raises(StoreLockedError) as refused:
        second.start()
    text = str(refused.value)
    assert "\n" not in text
    assert str(root) in text
    assert f"pid {holder_pid(root)}" in text
    assert _snapshot(root) == before
    assert (root / "abort").exists()
    assert live.put_message(message(1)).ok
    assert bodies(live) == [message(0).body, message(1).body]
    live.shutdown()
    assert holder_pid(root) is None  # released at a clean stop: the next start is allowed
    again = opener.open(root)
    assert bodies(again) == [message(0).body, message(1).body]


def test_holder_pid_is_read_only(tmp_path: Path) -> None:
    assert holder_pid(tmp_path) is None
    assert not (tmp_path / LOCK_FILE_NAME).exists()


async def _send(addr: str, first: int, count: int) -> None:
    async with Producer("StoreLockPG", addr, topics=[TOPIC]) as producer:
        for i in range(first, first + count):
            await producer.send(Message(TOPIC, f"m{i}".encode()))


def _verify_cli(store: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemq.cli.main", "store", "verify", str(store)],
        capture_output=True,
        text=True,
        timeout=REFUSAL_TIMEOUT_S,
        check=False,
    )


@pytest.mark.integration
async def test_a_second_broker_process_is_refused_and_the_live_one_keeps_going(
    tmp_path: Path,
) -> None:
    async with process_cluster(tmp_path, namesrvs=1, brokers=1) as pc:
        live = pc.brokers[0]
        assert live.store_dir is not None
        async with Admin(pc.namesrv_addr) as admin:

            async def registered() -> bool:
                return len(await admin.master_addresses()) == 1

            await eventually_async(registered, REFUSAL_TIMEOUT_S)
            await admin.create_topic(TOPIC, read_queue_nums=2, write_queue_nums=2)
        await _send(pc.namesrv_addr, 0, SENDS)
        # The second broker: same store, its own ports, as an operator would mistype it.
        args = list(live.args)
        args[args.index("--port") + 1] = str(free_broker_port())
        second = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "tidemq.cli.main", *args],
            capture_output=True,
            text=True,
            timeout=REFUSAL_TIMEOUT_S,
            check=False,
        )
        assert second.returncode == 1, second.stderr[-2000:]
        refusals = [line for line in second.stderr.splitlines() if "lock failed" in line]
        assert len(refusals) == 1, second.stderr[-2000:]
        assert str(live.store_dir) in refusals[0]
        assert f"pid {live.pid}" in refusals[0]
        assert "Traceback" not in second.stderr
        # The live broker's store is untouched: its abort marker is there, verify is clean,
        # and sends go on.
        assert (live.store_dir / "abort").exists()
        checked = await asyncio.to_thread(_verify_cli, live.store_dir)
        assert checked.returncode == 0, checked.stdout
        assert f"live broker (pid {live.pid})" in checked.stdout
        await _send(pc.namesrv_addr, SENDS, SENDS)
        await live.stop()
        report = verify(live.store_dir)
        assert report.ok, report.problems
        assert report.clean_stop
        assert report.live_pid is None
        assert report.records >= 2 * SENDS


@pytest.mark.integration
async def test_a_killed_broker_leaves_no_lock_behind(tmp_path: Path) -> None:
    """kill -9 runs no stop: the kernel drops the flock with the process, so the stale `lock`
    file (the dead pid inside) does not keep the broker from starting again."""
    async with process_cluster(tmp_path, namesrvs=1, brokers=1) as pc:
        broker = pc.brokers[0]
        assert broker.store_dir is not None
        dead_pid = broker.pid
        assert holder_pid(broker.store_dir) == dead_pid
        broker.kill()
        assert holder_pid(broker.store_dir) is None
        assert (broker.store_dir / LOCK_FILE_NAME).read_text().strip() == str(dead_pid)
        await broker.start()
        assert holder_pid(broker.store_dir) == broker.pid != dead_pid
