"""conf/broker.example.conf does not contradict itself: every value it sets that is not the
broker's default is named as an exception in its header, and storePathRootDir's own comment gives
the default a broker.conf without the key gets."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from tidemq.broker.config import BrokerConfig
from tidemq.broker.config_file import render_config

EXAMPLE: Final = Path(__file__).resolve().parent.parent / "conf" / "broker.example.conf"


def _values(text: str) -> dict[str, str]:
    settings = (line for line in text.splitlines() if line and line[0] != "#")
    return {key: value for key, _, value in (line.partition("=") for line in settings)}


def test_example_conf_names_every_value_that_is_not_the_default() -> None:
    text = EXAMPLE.read_text()
    header_lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        header_lines.append(line.removeprefix("#").strip())
    header = " ".join(header_lines)
    defaults = _values(render_config(BrokerConfig()))
    example = _values(text)
    differing = sorted(key for key in example if example[key] != defaults.get(key))
    assert differing == ["storePathRootDir"], differing
    for key in differing:
        assert f"except {key}: {example[key]} here" in header, header


def test_example_conf_store_dir_comment_gives_the_default() -> None:
    lines = EXAMPLE.read_text().splitlines()
    index = next(n for n, line in enumerate(lines) if line.startswith("storePathRootDir="))
    assert "(default ~/store)" in lines[index - 1], lines[index - 1]
