"""LeaseKeeper against a real etcd: the fencing deadline comes before etcd's expiry, a paused
etcd fires on_lost before the lease's key is gone, and a new lease follows when etcd is back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tidemq.clock import SystemClock
from tidemq.controller.etcd import EtcdSession
from tidemq.controller.lease import LeaseKeeper, lease_margin_s
from tidemq.testing import eventually, eventually_async
from tidemq.testing.etcd import EtcdProcess

pytestmark = pytest.mark.etcd

TTL_S = 2
KEY = "/t/alive/1"


class Recorder:
    """The keeper's callbacks, with the monotonic time of each, and the lease's key kept on
    every new lease (as a member does)."""

    def __init__(self, keeper: LeaseKeeper, session: EtcdSession) -> None:
        self.keeper = keeper
        self.session = session
        self.clock = keeper.clock
        self.lost_at: list[float] = []
        self.leases: list[int] = []
        keeper.on_lost = lambda: self.lost_at.append(self.clock.monotonic_ms())
        keeper.on_new_lease = self.leases.append


@pytest.fixture
async def keeper(session: EtcdSession) -> AsyncIterator[LeaseKeeper]:
    keeper = LeaseKeeper(session, TTL_S, SystemClock())
    yield keeper
    await keeper.stop(revoke=False)


async def _key_on_lease(session: EtcdSession, keeper: LeaseKeeper, n: int) -> int:
    await eventually(lambda: keeper.lease_id is not None and keeper.valid(), what=f"lease {n}")
    lease_id = keeper.lease_id
    assert lease_id is not None
    await session.put(KEY, b"x", lease=lease_id)
    return lease_id


def test_margin() -> None:
    assert lease_margin_s(1) == 0.25
    assert lease_margin_s(10) == 2.0


async def test_valid_until_passes_before_etcd_expires_the_lease(
    session: EtcdSession, keeper: LeaseKeeper
) -> None:
    clock = keeper.clock
    keeper.start()
    await _key_on_lease(session, keeper, 1)
    # A few renewals, so valid_until comes from a keep-alive, not the grant.
    renewed_from = keeper.valid_until_ms
    await eventually(lambda: keeper.valid_until_ms > renewed_from + 1000, what="renewals")
    valid_until = keeper.valid_until_ms
    await keeper.stop(revoke=False)  # no more keep-alives, nothing revoked: a crash

    async def gone() -> bool:
        return await session.get(KEY) is None

    await eventually_async(gone, 10.0, what="the key on the abandoned lease is gone")
    gone_at = clock.monotonic_ms()
    # The deadline passed before etcd dropped the key, by about the margin at least.
    assert valid_until < gone_at
    assert gone_at - valid_until >= lease_margin_s(TTL_S) * 1000 * 0.9


async def test_paused_etcd_fires_on_lost_before_the_key_goes_then_a_new_lease(
    etcd: EtcdProcess, session: EtcdSession
) -> None:
    # Calls that may take longer than the lease: only the deadline can fire on_lost in time.
    slow = EtcdSession([etcd.endpoint], call_timeout_s=5.0)
    keeper = LeaseKeeper(slow, TTL_S, SystemClock())
    recorder = Recorder(keeper, slow)
    keeper.start()
    first = await _key_on_lease(session, keeper, 1)
    observer = EtcdSession([etcd.endpoint], call_timeout_s=1.0)
    try:
        etcd.pause()
        try:
            valid_until = keeper.valid_until_ms
            await eventually(lambda: bool(recorder.lost_at), 10.0, what="on_lost")
            assert not keeper.valid()
            lost_at = recorder.lost_at[0]
            # The deadline alone fired it: no answer from etcd, no waiting on a call's timeout.
            assert valid_until <= lost_at < valid_until + 1000
        finally:
            etcd.resume()

        async def gone() -> bool:
            return await observer.get(KEY) is None

        await eventually_async(gone, 10.0, what="the key on the lost lease is gone")
        assert lost_at < keeper.clock.monotonic_ms()
        await eventually(lambda: len(recorder.leases) == 2 and keeper.valid(), 10.0, what="new")
        assert recorder.leases[0] == first
        assert recorder.leases[1] != first
        assert len(recorder.lost_at) == 1
    finally:
        await keeper.stop(revoke=False)
        await observer.close()
        await slow.close()


async def test_a_revoked_lease_is_lost_once_and_replaced(
    session: EtcdSession, keeper: LeaseKeeper
) -> None:
    recorder = Recorder(keeper, session)
    keeper.start()
    first = await _key_on_lease(session, keeper, 1)
    await session.revoke(first)  # as if etcd had expired it
    await eventually(lambda: len(recorder.leases) == 2 and keeper.valid(), 10.0, what="new lease")
    assert recorder.lost_at
    assert len(recorder.lost_at) == 1
    assert recorder.leases[1] != first
