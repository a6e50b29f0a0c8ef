"""`process_cluster()`: real `tidemq` processes that a test can kill, pause and restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq import Message, Producer
from tidemq.client.admin import Admin
from tidemq.testing import eventually_async
from tidemq.testing.processes import process_cluster

pytestmark = [pytest.mark.integration, pytest.mark.slow]


async def _route_brokers(admin: Admin, topic: str) -> set[str]:
    try:
        route = await admin.topic_route(topic)
    except Exception:
        return set()
    return {data.broker_name for data in route.broker_datas}


async def test_brokers_register_survive_sigkill_and_restart_on_their_store(tmp_path: Path) -> None:
    async with process_cluster(tmp_path, namesrvs=1, brokers=2) as pc:
        assert [b.name for b in pc.brokers] == ["broker-a", "broker-b"]
        async with Admin(pc.namesrv_addr) as admin:
            seen: set[str] = set()

            async def both_registered() -> bool:
                seen.update(await _route_brokers(admin, "TBW102"))
                return seen == {"broker-a", "broker-b"}

            await eventually_async(both_registered, 20, what="both brokers in the route")
            created = await admin.create_topic("ProcTopic", write_queue_nums=2, read_queue_nums=2)
            assert sorted(created) == sorted(b.address for b in pc.brokers)

        async with Producer("PG-proc", pc.namesrv_addr) as producer:
            result = await producer.send(Message("ProcTopic", b"before"))
            assert result.message_queue.broker_name in {"broker-a", "broker-b"}

        victim = pc.brokers[0]
        old_pid = victim.pid
        victim.kill()
        assert not victim.running
        assert victim.store_dir is not None
        assert (victim.store_dir / "abort").exists()
        await victim.start()
        assert victim.running
        assert victim.pid != old_pid
        assert "start 2" in victim.log_path.read_text()

        victim.pause()
        victim.resume()
        assert await victim.stop() == 0
        assert not (victim.store_dir / "abort").exists()
