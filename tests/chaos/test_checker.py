"""The chaos checker on hand-made histories: each check fails when its property is broken and
stays quiet when the history only shows what at-least-once delivery allows."""

from __future__ import annotations

import json
from pathlib import Path

from tidemq.testing.chaos.checker import (
    Ack,
    FaultRecord,
    History,
    Receipt,
    check,
    load_history,
    render,
)
from tidemq.testing.chaos.faults import KINDS, MASTER_FAULTS, OTHER_FAULTS, schedule


def receipt(message_id: str, offset: int, queue: int = 0, topic: str = "T") -> Receipt:
    return Receipt(message_id, topic, "broker-a", queue, offset, t=100.0 + offset)


def clean_history() -> History:
    return History(
        acked=[Ack("p-0", 1.0), Ack("p-1", 2.0)],
        attempted={"p-0", "p-1", "p-2", "t-0", "t-1"},
        receipts=[receipt("p-0", 0), receipt("p-1", 1), receipt("t-0", 0, topic="TX")],
        ledger={"t-0": "commit", "t-1": "rollback"},
    )


def test_a_clean_history_passes() -> None:
    verdict = check(clean_history())

    assert verdict.ok
    assert (verdict.acked, verdict.committed, verdict.rolled_back) == (2, 1, 1)
    assert "PASS" in render(verdict)


def test_an_acknowledged_message_never_received_is_lost() -> None:
    history = clean_history()
    history.receipts = [r for r in history.receipts if r.id != "p-1"]

    verdict = check(history)

    assert verdict.lost == ["p-1"]
    assert not verdict.ok
    assert "FAIL p-1" in render(verdict)


def test_an_unacknowledged_message_may_be_missing_or_present() -> None:
    missing = check(clean_history())
    history = clean_history()
    history.receipts.append(receipt("p-2", 2))  # stored although its send failed

    present = check(history)

    assert missing.ok
    assert present.ok


def test_a_rolled_back_transaction_that_is_visible_is_resurrected() -> None:
    history = clean_history()
    history.receipts.append(receipt("t-1", 1, topic="TX"))

    verdict = check(history)

    assert verdict.resurrected == ["t-1"]
    assert not verdict.ok


def test_a_committed_transaction_never_visible_fails() -> None:
    history = clean_history()
    history.receipts = [r for r in history.receipts if r.id != "t-0"]

    verdict = check(history)

    assert verdict.committed_invisible == ["t-0"]
    assert not verdict.ok


def test_a_received_id_nobody_sent_is_a_phantom() -> None:
    history = clean_history()
    history.receipts.append(receipt("x-9", 5))

    assert check(history).phantoms == ["x-9"]
    assert not check(history).ok


def test_duplicates_are_counted_not_failed() -> None:
    history = clean_history()
    history.receipts.append(receipt("p-0", 0))  # redelivered: same offset
    history.receipts.append(receipt("p-1", 7))  # stored twice: a retried send

    verdict = check(history)

    assert verdict.ok
    assert (verdict.duplicates, verdict.stored_twice) == (2, 1)


def ordered_history(offsets_to_seq: dict[int, int], queue: int = 0) -> History:
    ids = {offset: f"o-k0-{seq}" for offset, seq in offsets_to_seq.items()}
    return History(
        acked=[Ack(i, 1.0) for i in ids.values()],
        attempted=set(ids.values()),
        receipts=[receipt(i, offset, queue, topic="O") for offset, i in ids.items()],
        ordered={f"o-k0-{seq}": ("ordered0/k0", seq) for seq in offsets_to_seq.values()},
    )


def test_order_is_judged_by_queue_offset_not_by_arrival() -> None:
    history = ordered_history({0: 0, 1: 1, 2: 2})
    history.receipts.reverse()  # concurrent consumers deliver out of order

    assert check(history).order_violations == []


def test_a_lower_sequence_after_a_higher_one_in_a_queue_is_an_order_violation() -> None:
    verdict = check(ordered_history({0: 0, 1: 2, 2: 1}))

    assert [(v.offset, v.seq, v.after_seq) for v in verdict.order_violations] == [(2, 1, 2)]
    assert not verdict.ok


def test_a_retried_send_repeating_its_sequence_is_not_an_order_violation() -> None:
    history = ordered_history({0: 0, 1: 1, 3: 2})
    history.receipts.append(receipt("o-k0-1", 2, topic="O"))  # seq 1 stored again at offset 2

    verdict = check(history)

    assert verdict.order_violations == []
    assert verdict.stored_twice == 1


def test_an_offset_delivered_with_two_ids_is_reported_as_divergent() -> None:
    history = clean_history()
    history.attempted.add("p-2")
    history.receipts.append(receipt("p-2", 1))  # offset 1 held p-1 before

    verdict = check(history)

    assert verdict.divergent_offsets == 1
    assert verdict.ok  # reported, not failed: the acknowledged p-1 was still received


def test_the_outage_is_the_longest_gap_between_acks_until_one_after_the_heal() -> None:
    history = clean_history()
    # Sends go on for 1.5 s (the lease), then stop until 6.0, after the heal at 5.0.
    history.acked = [Ack(f"p-{i}", t) for i, t in enumerate([0.5, 1.0, 1.5, 6.0, 6.2])]
    history.faults = [
        FaultRecord("partition_master_etcd", "b1", 0.9, 5.0),
        FaultRecord("kill_master", "b1", 5.5, 7.0),  # no ack after its heal
    ]

    first, unhealed = check(history).recoveries

    assert first.seconds is not None
    assert round(first.seconds, 2) == 0.1
    assert first.outage == 4.5
    assert unhealed.seconds is not None
    assert unhealed.outage is None


def test_recovery_runs_from_the_fault_to_the_first_ack_after_it() -> None:
    history = clean_history()
    history.acked = [Ack("p-0", 10.0), Ack("p-1", 14.5)]
    history.faults = [
        FaultRecord("kill_master", "b1", 11.0, 13.0, sync_set="1,2,3"),
        FaultRecord("kill_slave", "b2", 20.0, 21.0),
        FaultRecord("partition_master", "-", 12.0, 12.0, skipped="no network namespaces"),
    ]

    verdict = check(history)

    assert [r.seconds for r in verdict.recoveries] == [3.5, None, None]
    table = render(verdict)
    assert "kill_master b1 (2.0 s) in-sync {1,2,3}" in table
    assert "recovered in 3.50 s" in table
    assert "no send after it" in table
    assert "skipped: no network namespaces" in table


def test_servers_that_exited_on_their_own_are_reported_not_failed() -> None:
    history = clean_history()
    history.crashes = ["b1", "b2", "b1"]

    verdict = check(history)

    assert verdict.ok
    assert "reported: b1 x2, b2 x1" in render(verdict)


def test_load_history_reads_journals_and_skips_a_cut_line(tmp_path: Path) -> None:
    producer = tmp_path / "ordered0.jsonl"
    producer.write_text(
        '{"ev":"ready","t":1}\n'
        '{"ev":"try","t":1.5,"id":"o0-k0-0","key":"k0","seq":0}\n'
        '{"ev":"ack","t":2,"id":"o0-k0-0","key":"k0","seq":0,"q":1,"qo":0}\n'
        '{"ev":"try","t":3,"id":"o0-k'  # cut by a kill
    )
    consumer = tmp_path / "consumer0.jsonl"
    consumer.write_text(
        json.dumps({"ev": "recv", "t": 4, "id": "o0-k0-0", "topic": "O", "b": "a", "q": 1, "qo": 0})
    )
    faults = tmp_path / "faults.jsonl"
    faults.write_text(
        json.dumps({"kind": "kill_master", "target": "b1", "start": 1.7, "end": 3.0}) + "\n"
    )

    crashes = tmp_path / "crashes.jsonl"
    crashes.write_text(json.dumps({"name": "b2", "t": 5, "when": "before step", "log": ""}))

    history = load_history([producer, consumer], {"t0-0": "commit"}, faults, crashes)

    assert history.attempted == {"o0-k0-0"}
    assert [a.id for a in history.acked] == ["o0-k0-0"]
    assert history.ordered == {"o0-k0-0": ("ordered0/k0", 0)}
    assert history.receipts == [Receipt("o0-k0-0", "O", "a", 1, 0, 4)]
    assert history.faults[0].kind == "kill_master"
    assert history.crashes == ["b2"]
    assert check(history).committed_invisible == ["t0-0"]


def test_the_schedule_is_the_seeds_and_covers_every_kind_alone_and_mixed() -> None:
    steps = schedule(7, 40)

    assert steps == schedule(7, 40)
    assert steps != schedule(8, 40)
    alone = {s.kinds[0] for s in steps if len(s.kinds) == 1}
    assert alone == set(KINDS)
    mixed = [s.kinds for s in steps if len(s.kinds) == 2]
    assert len(mixed) == 10
    assert all(a in MASTER_FAULTS and b in OTHER_FAULTS for a, b in mixed)
    assert all(0 < s.hold_s <= 8 and s.quiet_s >= 3 for s in steps)
