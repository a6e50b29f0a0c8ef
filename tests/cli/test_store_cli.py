"""`tidemq store verify|dump` on a real store directory, through the CLI entry point."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tidemq.cli.main import main
from tidemq.clock import SystemClock
from tidemq.store import FileMessageStore, MessageToStore, StoreConfig, tools


def _message(topic: str, body: bytes, properties: str = "") -> MessageToStore:
    return MessageToStore(
        topic=topic,
        queue_id=0,
        body=body,
        flag=0,
        properties=properties,
        sys_flag=0,
        born_timestamp=0,
        born_host=("127.0.0.1", 1),
        store_host=("127.0.0.1", 2),
    )


def _store_with_messages(root: Path, count: int) -> None:
    store = FileMessageStore(StoreConfig(root_dir=root, commit_log_file_size=4096), SystemClock())
    store.start()
    for index in range(count):
        result = store.put_message(_message("CliTopic", f"body-{index}".encode(), "TAGS\x01t\x02"))
        assert result.ok
    store.shutdown()


def test_verify_reports_progress_about_once_per_mib(tmp_path: Path) -> None:
    store = FileMessageStore(
        StoreConfig(root_dir=tmp_path, commit_log_file_size=1 << 20), SystemClock()
    )
    store.start()
    for _ in range(3):
        assert all(r.ok for r in store.put_each([_message("Big", b"b" * 8000)] * 120))
    store.shutdown()
    steps: list[int] = []
    report = tools.verify(tmp_path, steps.append)
    assert report.ok
    assert sum(steps) == report.end_offset - report.first_offset  # every byte read, once
    assert len(steps) >= 2
    assert all(step <= tools.PROGRESS_STEP + 16_000 for step in steps)


def test_verify_passes_on_a_clean_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _store_with_messages(tmp_path, 40)
    assert main(["store", "verify", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "40 records in" in out
    assert out.rstrip().endswith("OK")


def test_verify_fails_on_a_flipped_bit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _store_with_messages(tmp_path, 3)
    segment = tmp_path / "commitlog" / ("0" * 20)
    data = bytearray(segment.read_bytes())
    data[100] ^= 0x01  # inside the first record
    segment.write_bytes(bytes(data))
    assert main(["store", "verify", str(tmp_path)]) == 1
    assert "problem: " in capsys.readouterr().out


def test_dump_prints_at_most_limit_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _store_with_messages(tmp_path, 10)
    assert main(["store", "dump", str(tmp_path), "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert out.count("CliTopic") == 3


def test_verify_and_dump_print_one_json_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _store_with_messages(tmp_path, 5)
    capsys.readouterr()
    assert main(["store", "verify", str(tmp_path), "--json"]) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert (report["ok"], report["records"], report["problems"]) == (True, 5, [])
    assert main(["store", "dump", str(tmp_path), "--json", "--limit", "2"]) == 0
    dumped = orjson.loads(capsys.readouterr().out)
    assert dumped["limited"] is True
    assert [(r["topic"], r["queue_offset"], r["body_size"]) for r in dumped["records"]] == [
        ("CliTopic", 0, 6),
        ("CliTopic", 1, 6),
    ]
    assert dumped["records"][0]["properties"]["TAGS"] == "t"
    assert main(["store", "dump", str(tmp_path), "--json"]) == 0
    whole = orjson.loads(capsys.readouterr().out)
    assert (len(whole["records"]), whole["limited"]) == (5, False)
    assert whole["end_offset"] == dumped["records"][0]["total_size"] * 5
