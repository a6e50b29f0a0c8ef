"""IndexService.put_many writes exactly what one put per entry writes, across full files."""

from __future__ import annotations

from pathlib import Path

from tidemq.store.index import IndexService


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_put_many_matches_single_puts_across_files(tmp_path: Path) -> None:
    entries = [(f"T#K{i % 7}", 1000 + i * 97, 1_700_000_000_000 + i * 700) for i in range(50)]
    many = IndexService(tmp_path / "many", slot_count=5, entry_count=8)
    single = IndexService(tmp_path / "single", slot_count=5, entry_count=8)
    many.put_many(entries[:3])
    many.put_many(entries[3:])
    for entry in entries:
        single.put(*entry)
    many.close()
    single.close()
    assert len(_files(tmp_path / "many")) == 8  # 7 entries a file (entry 0 is unused)
    assert _files(tmp_path / "many") == _files(tmp_path / "single")
    reopened = IndexService(tmp_path / "many", slot_count=5, entry_count=8)
    assert reopened.load()
    found = reopened.query("T#K3", 100, 0, 2_000_000_000_000)
    assert found == sorted((off for key, off, _ in entries if key == "T#K3"), reverse=True)
    reopened.close()
