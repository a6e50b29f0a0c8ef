"""`tidemq store verify|dump` on a real store directory, through the CLI entry point."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq.cli.main import main
from tidemq.clock import SystemClock
from tidemq.store import FileMessageStore, MessageToStore, StoreConfig


def _store_with_messages(root: Path, count: int) -> None:
    store = FileMessageStore(StoreConfig(root_dir=root, commit_log_file_size=4096), SystemClock())
    store.start()
    for index in range(count):
        result = store.put_message(
            MessageToStore(
                topic="CliTopic",
                queue_id=0,
                body=f"body-{index}".encode(),
                flag=0,
                properties="TAGS\x01t\x02",
                sys_flag=0,
                born_timestamp=0,
                born_host=("127.0.0.1", 1),
                store_host=("127.0.0.1", 2),
            )
        )
        assert result.ok
    store.shutdown()


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
