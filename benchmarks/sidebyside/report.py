"""Renders one run as Markdown: one table of absolute figures and ratios, then the machine.

Ratios: TideMQ / the best peer *at equal durability* (ASYNC_FLUSH against Redis everysec and
NATS; SYNC_FLUSH against Redis always and RabbitMQ confirms), and TideMQ / the disk's limit
(ASYNC_FLUSH: bytes/s / sequential write without fsync; SYNC_FLUSH: bytes/s / 64 KiB appends
with fdatasync each, the group-commit ceiling). For latencies lower is better, so the ratio is
TideMQ's p99 / the best (lowest) peer p99.
"""

from __future__ import annotations

import math
from typing import Any

ASYNC_CLASS = {"redis", "nats", "tidemq ASYNC_FLUSH"}
SYNC_CLASS = {"redis-always", "rabbitmq", "tidemq SYNC_FLUSH"}


def _number(value: Any, digits: int = 0) -> str:
    if not isinstance(value, int | float) or math.isnan(value):
        return "-"
    return f"{value:,.{digits}f}"


def _figure(row: dict[str, Any]) -> tuple[str, float | None]:
    median = row["median"]
    if "error" in median:
        return f"error: {median['error'][:80]}", None
    key = row["key"]
    if key.startswith("e2e"):
        text = (
            f"p50 {_number(median['e2e_p50_us'] / 1000, 2)} / p99 "
            f"{_number(median['e2e_p99_us'] / 1000, 2)} ms"
            f" (ack p99 {_number(median['ack_p99_us'] / 1000, 2)} ms,"
            f" {_number(median['rate_achieved'])}/s achieved, {_number(median['received'])} recv)"
        )
        return text, median["e2e_p99_us"]
    value = median[key]
    spread = ""
    if f"{key}_min" in median and median.get("runs", 1) > 1:
        spread = f" ({_number(median[key + '_min'])}-{_number(median[key + '_max'])})"
    text = f"{_number(value)}{spread}"
    if "ack_p99_us" in median:
        text += f"; ack p50/p99 {_number(median['ack_p50_us'])}/{_number(median['ack_p99_us'])} us"
    if "ratio" in median:
        text += f"; plain {_number(median['plain_rate'])}/s; tx/plain {median['ratio']:.2f}"
    return text, float(value)


def _durability_class(system: str) -> set[str] | None:
    for group in (ASYNC_CLASS, SYNC_CLASS):
        if system in group:
            return group
    return None


def ratios(rows: list[dict[str, Any]], machine: dict[str, Any]) -> None:
    """Fills row["vs_peer"] and row["vs_disk"] for TideMQ rows (in place)."""
    by_case: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        row["value"] = _figure(row)[1]
        by_case.setdefault(row["case"], []).append(row)
    for row in rows:
        system = row["system"]
        if not system.startswith("tidemq") or row["value"] is None:
            continue
        group = _durability_class(system)
        lower_better = row["key"].startswith("e2e")
        peers = [
            other["value"]
            for other in by_case[row["case"]]
            if group
            and other["system"] in group
            and not other["system"].startswith("tidemq")
            and other["value"] is not None
            and other.get("comparable", True)
        ]
        if peers and row.get("comparable", True):
            best = min(peers) if lower_better else max(peers)
            row["vs_peer"] = f"{row['value'] / best:.2f}x" + (
                " (lower is better)" if lower_better else ""
            )
        size = row.get("size", 1024)
        if not lower_better and row["key"] == "rate" and machine:
            mib_s = row["value"] * size / 2**20
            if system.endswith(" SYNC_FLUSH"):
                limit = machine["fdatasync_64k_per_s"] * 64 * 1024 / 2**20
                row["vs_disk"] = f"{mib_s / limit:.2f}x group commit"
            else:
                row["vs_disk"] = f"{mib_s / machine['seq_write_mib_s']:.2f}x seq write"


def table(rows: list[dict[str, Any]], machine: dict[str, Any]) -> str:
    ratios(rows, machine)
    lines = [
        "| case | system | client | durability | median (min-max) | TideMQ / best peer, equal "
        "durability | TideMQ / disk | foreign CPU (cores) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        text, _ = _figure(row)
        foreign = row["median"].get("cpu_foreign")
        lines.append(
            f"| {row['case']} | {row['system']} | {row.get('client', '')} | {row['durability']} "
            f"| {text} | {row.get('vs_peer', '')} | {row.get('vs_disk', '')} "
            f"| {_number(foreign, 2)} |"
        )
    return "\n".join(lines)


def machine_table(machine: dict[str, Any]) -> str:
    labels = {
        "seq_write_mib_s": ("sequential write 1 MiB blocks, no fsync", "MiB/s"),
        "seq_write_sync_mib_s": ("sequential write incl. one fdatasync at the end", "MiB/s"),
        "fdatasync_4k_per_s": ("append 4 KiB + fdatasync each", "fdatasync/s"),
        "fdatasync_64k_per_s": ("append 64 KiB + fdatasync each", "fdatasync/s"),
        "group_commit_msgs_s": ("group-commit limit (64 KiB per fdatasync)", "1 KiB msg/s"),
        "loopback_pingpong_s": ("loopback TCP, Python asyncio 1 KiB ping-pong", "round trips/s"),
        "loopback_stream_mib_s": ("loopback TCP, Python asyncio stream", "MiB/s"),
    }
    lines = ["| machine limit | median (min-max) | unit |", "|---|---|---|"]
    for key, (label, unit) in labels.items():
        if key in machine:
            spread = ""
            if f"{key}_min" in machine and machine.get("runs", 1) > 1:
                spread = f" ({_number(machine[key + '_min'])}-{_number(machine[key + '_max'])})"
            lines.append(f"| {label} | {_number(machine[key])}{spread} | {unit} |")
    return "\n".join(lines)
