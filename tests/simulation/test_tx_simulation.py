"""Seeded whole-transaction simulation (testing/sim_tx.py): loss, delay, producer kills and
broker restarts against the real resolver, check-back service and store.

A failure prints `--seed=N`; `pytest tests/simulation --seed=N` (or TIDEMQ_SIM_SEED=N) replays
exactly that run. See docs/internals/testing.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq.broker.transaction import half as hm
from tidemq.broker.transaction.rebuild import scan_queue
from tidemq.testing.sim_tx import TxSimConfig, TxSimReport, TxSimulation

pytestmark = pytest.mark.simulation


async def simulate(config: TxSimConfig, root: Path) -> tuple[TxSimulation, TxSimReport]:
    simulation = TxSimulation(config, root)
    try:
        report = await simulation.run()
    finally:
        simulation.close()
    return simulation, report


def explain(report: TxSimReport) -> str:
    shown = "\n  ".join(report.violations[:20])
    return (
        f"transaction simulation failed: replay with --seed={report.seed} "
        f"(TIDEMQ_SIM_SEED={report.seed})\n{report.summary()}\n  {shown}"
    )


async def test_transactions_survive_loss_kills_and_restarts(seed: int, tmp_path: Path) -> None:
    _, report = await simulate(TxSimConfig(seed=seed), tmp_path)
    assert not report.violations, explain(report)
    # The run exercised what it claims to (else the invariants are checked on nothing).
    assert report.transactions == TxSimConfig(seed=seed).transactions, explain(report)
    assert report.committed_locally > 0, explain(report)
    assert report.frames_dropped > 0, explain(report)
    assert report.stats["checked"] > 0, explain(report)


async def test_a_commit_after_the_broker_gave_up_is_reported(tmp_path: Path) -> None:
    # Local transactions that settle only after the check window: the broker discards their
    # half messages, so the ones that then commit locally are never consumable. The checker
    # must say so (it is what a lost commit would look like).
    config = TxSimConfig(
        seed=11,
        unknown_probability=0.5,
        unknown_never_settles_probability=0.0,
        settle_ms_min=4_500,
        settle_ms_max=4_600,
        kill_probability=0.0,
        broker_restarts=0,
    )
    _, report = await simulate(config, tmp_path)
    assert report.stats["discarded"] > 0
    lost = [v for v in report.violations if "consumable 0 times, local transaction committed" in v]
    assert lost, report.violations


async def test_a_duplicate_in_the_real_topic_is_reported(tmp_path: Path) -> None:
    simulation = TxSimulation(TxSimConfig(seed=12, transactions=20, broker_restarts=0), tmp_path)
    try:
        report = await simulation.run()
        assert not report.violations, explain(report)
        committed = simulation.broker.visible_counts()
        txid = min(committed)
        store = simulation.broker.store
        end = store.max_offset(hm.HALF_TOPIC, hm.HALF_QUEUE_ID)
        for half in scan_queue(store, hm.HALF_TOPIC, 0, end):
            if half.property_map()["SIM_TXID"] == txid:
                # Store the committed message a second time, as a broken resolver would.
                assert store.put_message(hm.to_real_message(half)).ok
                break
        simulation.check_visibility()
        assert any(v.startswith(f"{txid}: consumable 2 times") for v in report.violations)
    finally:
        simulation.close()


# Seed 293 once found checks of one transaction landing, pass after pass, on connections that
# crashed producers left open while a live producer existed; the check-back service now rotates
# connections per transaction. Kept as a regression test.
async def test_seed_293_checks_of_one_transaction_rotate_over_connections(
    tmp_path: Path,
) -> None:
    _, report = await simulate(TxSimConfig(seed=293), tmp_path)
    assert not report.violations, explain(report)
