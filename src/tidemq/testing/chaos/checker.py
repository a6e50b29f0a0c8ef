"""The chaos suite's verdict: what the clients recorded, checked against the promise.

    History (acks, attempts, deliveries, the ledger's decisions, the fault log)
        │  check()  (pure: unit-tested with hand-made histories)
        ▼
    Verdict ── render() ──▶ one table;  Verdict.ok ──▶ the runner's exit status

Checks (openchaos's, plus transactions):
- acknowledged-but-lost: a SEND_OK id no consumer ever received;
- rolled-back-but-visible: a transaction the ledger rolled back that a consumer received;
- committed-but-never-visible: a transaction the ledger committed that no consumer received;
- phantoms: a received id nobody ever tried to send (a corrupt or foreign record);
- duplicates: deliveries beyond the first of an id, counted (at-least-once allows them) and
  split into redeliveries (same queue offset again) and copies stored twice (a retried send);
- order: in each queue, read in queue-offset order, the sequence numbers of one ordered key
  never go down (a retried send repeats its number, which is a duplicate, not a violation);
- divergent offsets: one queue offset delivered with two different ids (a consumer saw a
  message that a failover later replaced): reported;
- recovery time per fault: from the fault's start to the first acknowledged send after it.

Any loss, resurrection, phantom or order violation makes the verdict fail.
"""

from __future__ import annotations

import bisect
import itertools
import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Examples shown in the table per failing check.
EXAMPLES_MAX = 3


@dataclass(frozen=True)
class Ack:
    """An acknowledged (SEND_OK) send; `key`/`seq` for the ordered producer's."""

    id: str
    t: float
    key: str | None = None
    seq: int | None = None


@dataclass(frozen=True)
class Receipt:
    """One delivery to a consumer."""

    id: str
    topic: str
    broker: str
    queue: int
    offset: int
    t: float = 0.0


@dataclass(frozen=True)
class FaultRecord:
    kind: str
    target: str
    start: float
    end: float
    skipped: str | None = None  # why the fault was not applied (e.g. no namespaces)
    # The master's in-sync set (replica ids) when the fault began, if the broker reported one:
    # a master fault with the master alone in it cannot fail over (no unclean election).
    sync_set: str | None = None


@dataclass
class History:
    acked: list[Ack] = field(default_factory=list)
    attempted: set[str] = field(default_factory=set)
    receipts: list[Receipt] = field(default_factory=list)
    # The transactional producer's ledger: id → "commit" | "rollback".
    ledger: Mapping[str, str] = field(default_factory=dict)
    faults: list[FaultRecord] = field(default_factory=list)
    # Ordered ids → (ordering key, sequence number): from the producer's records.
    ordered: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    # Servers found exited that no fault had killed (the runner restarted them).
    crashes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class OrderViolation:
    queue: str
    key: str
    offset: int
    seq: int
    after_seq: int


@dataclass(frozen=True)
class Recovery:
    fault: FaultRecord
    seconds: float | None  # None: no acknowledged send after the fault
    # The longest time without an acknowledged send from the fault's start to the first ack
    # after its end (None: no ack after its end).
    outage: float | None = None


@dataclass
class Verdict:
    acked: int
    attempted: int
    received_ids: int
    deliveries: int
    lost: list[str]
    resurrected: list[str]
    committed_invisible: list[str]
    phantoms: list[str]
    duplicates: int
    stored_twice: int
    order_violations: list[OrderViolation]
    divergent_offsets: int
    committed: int
    rolled_back: int
    recoveries: list[Recovery]
    crashes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.resurrected
            or self.committed_invisible
            or self.phantoms
            or self.order_violations
        )


def _order_violations(
    receipts: Iterable[Receipt], ordered: Mapping[str, tuple[str, int]]
) -> tuple[list[OrderViolation], int]:
    """Per queue, in offset order (each offset once), a key's sequence numbers never go down.
    Also counts offsets delivered with two different ids (divergent histories)."""
    by_queue: dict[tuple[str, str, int], dict[int, str]] = defaultdict(dict)
    divergent = 0
    for r in receipts:
        slots = by_queue[(r.topic, r.broker, r.queue)]
        seen = slots.setdefault(r.offset, r.id)
        if seen != r.id:
            divergent += 1
    violations = []
    for (topic, broker, queue), slots in sorted(by_queue.items()):
        highest: dict[str, int] = {}
        for offset in sorted(slots):
            entry = ordered.get(slots[offset])
            if entry is None:
                continue
            key, seq = entry
            top = highest.get(key, -1)
            if seq < top:
                name = f"{topic}/{broker}/{queue}"
                violations.append(OrderViolation(name, key, offset, seq, top))
            highest[key] = max(top, seq)
    return violations, divergent


def _recoveries(faults: Iterable[FaultRecord], acks: Iterable[Ack]) -> list[Recovery]:
    times = sorted(a.t for a in acks)
    result = []
    for fault in faults:
        if fault.skipped:
            result.append(Recovery(fault, None))
            continue
        start = bisect.bisect_right(times, fault.start)
        if start == len(times):
            result.append(Recovery(fault, None))
            continue
        # The outage: the longest stretch without an ack from the fault's start to the first
        # ack after it healed (a partition from etcd stops sends only once the lease runs out).
        end = bisect.bisect_right(times, fault.end)
        outage = None
        if end < len(times):
            window = [fault.start, *times[start : end + 1]]
            outage = max(b - a for a, b in itertools.pairwise(window))
        result.append(Recovery(fault, times[start] - fault.start, outage))
    return result


def check(history: History) -> Verdict:
    """The verdict on one run's history (pure)."""
    received: dict[str, list[Receipt]] = defaultdict(list)
    for r in history.receipts:
        received[r.id].append(r)
    acked_ids = {a.id for a in history.acked}
    committed = {i for i, s in history.ledger.items() if s == "commit"}
    rolled_back = {i for i, s in history.ledger.items() if s == "rollback"}
    duplicates = sum(len(rs) - 1 for rs in received.values())
    stored_twice = sum(
        len({(r.topic, r.broker, r.queue, r.offset) for r in rs}) - 1 for rs in received.values()
    )
    violations, divergent = _order_violations(history.receipts, history.ordered)
    return Verdict(
        acked=len(acked_ids),
        attempted=len(history.attempted),
        received_ids=len(received),
        deliveries=len(history.receipts),
        lost=sorted(acked_ids - received.keys()),
        resurrected=sorted(rolled_back & received.keys()),
        committed_invisible=sorted(committed - received.keys()),
        phantoms=sorted(received.keys() - history.attempted),
        duplicates=duplicates,
        stored_twice=stored_twice,
        order_violations=violations,
        divergent_offsets=divergent,
        committed=len(committed),
        rolled_back=len(rolled_back),
        recoveries=_recoveries(history.faults, history.acked),
        crashes=list(history.crashes),
    )


def _examples(ids: list[str]) -> str:
    shown = ", ".join(ids[:EXAMPLES_MAX])
    return shown + (", ..." if len(ids) > EXAMPLES_MAX else "")


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _summary(values: list[float]) -> str:
    p50, p99 = statistics.median(values), _percentile(values, 0.99)
    return f"p50 {p50:.2f} s, p99 {p99:.2f} s, max {max(values):.2f} s"


def _count_rows(v: Verdict) -> list[tuple[str, str, str]]:
    def must_be_zero(name: str, ids: list[str]) -> tuple[str, str, str]:
        return (name, str(len(ids)), "FAIL " + _examples(ids) if ids else "ok")

    orders = [f"{o.queue} {o.key}: seq {o.seq} after {o.after_seq}" for o in v.order_violations]
    return [
        ("sends attempted / acknowledged", f"{v.attempted} / {v.acked}", ""),
        ("ids received / deliveries", f"{v.received_ids} / {v.deliveries}", ""),
        must_be_zero("acknowledged-but-lost", v.lost),
        ("transactions committed / rolled back", f"{v.committed} / {v.rolled_back}", ""),
        must_be_zero("rolled-back-but-visible", v.resurrected),
        must_be_zero("committed-but-never-visible", v.committed_invisible),
        must_be_zero("phantoms (never sent)", v.phantoms),
        ("duplicates (of which stored twice)", f"{v.duplicates} ({v.stored_twice})", "allowed"),
        must_be_zero("order violations", orders),
        ("divergent offsets", str(v.divergent_offsets), "reported"),
        ("processes that exited on their own", str(len(v.crashes)), _crash_note(v.crashes)),
    ]


def _crash_note(names: list[str]) -> str:
    if not names:
        return ""
    counts = {name: names.count(name) for name in sorted(set(names))}
    return "reported: " + ", ".join(f"{n} x{c}" for n, c in counts.items())


def _fault_rows(v: Verdict) -> list[tuple[str, str, str]]:
    rows = []
    for number, rec in enumerate(v.recoveries, 1):
        f = rec.fault
        name = f"fault {number}: {f.kind} {f.target} ({f.end - f.start:.1f} s)"
        if f.sync_set is not None:
            name += f" in-sync {{{f.sync_set}}}"
        if f.skipped:
            rows.append((name, "-", f"skipped: {f.skipped}"))
        elif rec.seconds is None:
            rows.append((name, "no send after it", "reported"))
        else:
            outage = "-" if rec.outage is None else f"{rec.outage:.2f} s"
            rows.append((name, f"recovered in {rec.seconds:.2f} s", f"longest gap {outage}"))
    for label, values in (
        ("recovery", [r.seconds for r in v.recoveries if r.seconds is not None]),
        ("longest gap", [r.outage for r in v.recoveries if r.outage is not None]),
    ):
        if values:
            rows.append((f"{label} over {len(values)} faults", _summary(values), ""))
    return rows


def render(v: Verdict, title: str = "chaos run") -> str:
    """The run's one table, with the verdict in its last row."""
    rows = [*_count_rows(v), *_fault_rows(v)]
    rows.append(("VERDICT", "PASS" if v.ok else "FAIL", ""))
    widths = [max(len(r[i]) for r in [*rows, ("check", "value", "")]) for i in range(3)]
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells: tuple[str, str, str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    body = [line(r) for r in rows]
    return "\n".join([title, rule, line(("check", "value", "")), rule, *body, rule])


# -- loading a run's records (I/O; `check` above stays pure) ----------------------------------


def _records(path: Path) -> Iterable[dict[str, Any]]:
    with path.open() as lines:
        for line in lines:
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except ValueError:
                continue  # a line cut short by a kill: that record was never complete
            if isinstance(record, dict):
                yield record


def _journal(history: History, path: Path, ordered: dict[str, tuple[str, int]]) -> None:
    for rec in _records(path):
        event, rid = rec.get("ev"), str(rec.get("id", ""))
        if event == "try":
            history.attempted.add(rid)
            if "key" in rec:
                ordered[rid] = (f"{path.stem}/{rec['key']}", int(rec["seq"]))
        elif event == "ack":
            history.acked.append(Ack(rid, float(rec["t"])))
        elif event == "recv":
            receipt = Receipt(
                rid, str(rec["topic"]), str(rec["b"]), int(rec["q"]), int(rec["qo"]), rec["t"]
            )
            history.receipts.append(receipt)


def load_history(
    journals: Iterable[Path],
    ledger: Mapping[str, str],
    faults: Path,
    crashes: Path | None = None,
) -> History:
    """Read the workload's journals (JSON lines, workload.py), the ledger, the fault log and
    the runner's log of processes (servers, clients) that exited on their own."""
    history = History(ledger=dict(ledger))
    ordered: dict[str, tuple[str, int]] = {}
    for path in journals:
        _journal(history, path, ordered)
    history.ordered = ordered
    if faults.exists():
        history.faults.extend(FaultRecord(**rec) for rec in _records(faults))
    if crashes is not None and crashes.exists():
        history.crashes.extend(str(rec["name"]) for rec in _records(crashes))
    return history
