"""The loader of RocketMQ-style broker.conf files: layered sources onto one BrokerConfig.

Sources are layered, later wins:

    1. defaults in BrokerConfig (RocketMQ 4.9.7's defaults)
    2. the broker.conf file        key=value, '#'/'!' comments, RocketMQ key names
    3. the environment             TIDEMQ_<KEY IN UPPER SNAKE CASE>, e.g. TIDEMQ_BROKER_NAME,
                                   TIDEMQ_NAMESRV_ADDR, TIDEMQ_LISTEN_PORT. RocketMQ's own
                                   NAMESRV_ADDR is honoured too (below TIDEMQ_NAMESRV_ADDR).
    4. overrides (CLI flags)       keyed by RocketMQ key or by field name

An unknown key in the file or the environment is logged as a warning, with the nearest known key
if one is close ("did you mean brokerName?"), and ignored (many RocketMQ keys tune JVM thread
pools that have no meaning here); an unknown key among the overrides (`--set`) is an error: it was
typed just now, for this run. A value that does not parse raises ConfigError naming the key and
value. `render_config` prints the effective values back as broker.conf lines (`--print-config`,
and the generator of conf/broker.example.conf). Kept apart from config.py: the settings change
with the broker's features, the way files are read and layered does not.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from tidemq.broker.config import ENV_PREFIX, BrokerConfig, ConfigError
from tidemq.broker.config_keys import KEYS, ConfigKey, parse_int, parse_path
from tidemq.broker.properties import parse_properties
from tidemq.limits import CONSUME_QUEUE_ENTRY_SIZE

log = logging.getLogger(__name__)

# aclFilePath when not set: this name beside the broker.conf file.
ACL_FILE_NAME: Final = "plain_acl.yml"


# How alike (difflib's ratio, case ignored) an unknown key must be to a known one to be suggested:
# catches typos (brokerNmae, namesrvAddress) without suggesting a different setting for one of
# the many RocketMQ keys that mean nothing here (flushIntervalConsumeQueue).
SUGGEST_RATIO_MIN: Final = 0.8

# Keys needing conversion or cross-checks rather than a plain field assignment: the consume
# queue's file size (bytes, kept as entries; also under RocketMQ's old misspelling) and the
# commit-log directory.
_CONSUME_QUEUE_SIZE_KEYS: Final = ("mappedFileSizeConsumeQueue", "mapedFileSizeConsumeQueue")
_SPECIAL_KEYS: Final = frozenset({*_CONSUME_QUEUE_SIZE_KEYS, "storePathCommitLog"})

_BY_KEY: Final[dict[str, ConfigKey]] = {k.name: k for k in KEYS} | {
    alias: k for k in KEYS for alias in k.aliases
}
_BY_FIELD: Final[dict[str, ConfigKey]] = {k.field: k for k in KEYS}
assert set(_BY_FIELD) == {f.name for f in dataclasses.fields(BrokerConfig)} - {
    "consume_queue_file_entries"
}


def _env_name(key: str) -> str:
    # tls.server.certPath → TIDEMQ_TLS_SERVER_CERT_PATH
    return ENV_PREFIX + re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key).upper().replace(".", "_")


def load_broker_config(
    path: str | Path | None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, object] | None = None,
) -> BrokerConfig:
    """Defaults, then the broker.conf at `path`, then `env`, then `overrides` (see module doc)."""
    values: dict[str, Any] = {}
    source_of: dict[str, str] = {}
    if path is not None:
        text = Path(path).read_text(encoding="utf-8")
        for key, raw in parse_properties(text):
            _apply(values, source_of, key, raw, f"{path}")
    if env is not None:
        # RocketMQ's own variable first, so TIDEMQ_NAMESRV_ADDR beats it.
        if "NAMESRV_ADDR" in env:
            _apply(values, source_of, "namesrvAddr", env["NAMESRV_ADDR"], "env NAMESRV_ADDR")
        known_env = {_env_name(k): k for k in [*_BY_KEY, *_SPECIAL_KEYS]}
        for env_name, env_value in env.items():
            if not env_name.startswith(ENV_PREFIX):
                continue
            env_key = known_env.get(env_name)
            if env_key is None:
                # The environment is shared with the name server and tools: not an error here.
                log.debug("environment variable %s is not a broker setting", env_name)
                continue
            _apply(values, source_of, env_key, env_value, f"env {env_name}")
    if overrides is not None:
        for name, value in overrides.items():
            if name == "consume_queue_file_entries":
                _set(values, source_of, name, value, "override", name)
                continue
            override_key = _BY_FIELD[name].name if name in _BY_FIELD else name
            _apply(values, source_of, override_key, value, "override")
    if path is not None and values.get("acl_enable") and values.get("acl_file_path") is None:
        # As upstream's conf/plain_acl.yml beside conf/broker.conf.
        values["acl_file_path"] = Path(path).parent / ACL_FILE_NAME
    root = values.get("store_path_root_dir", BrokerConfig().store_path_root_dir)
    commit_log_dir = values.pop("_store_path_commit_log", None)
    if commit_log_dir is not None and Path(commit_log_dir) != Path(root) / "commitlog":
        raise ConfigError(
            f"storePathCommitLog={str(commit_log_dir)!r}: TideMQ keeps the commit log at "
            f"<storePathRootDir>/commitlog ({Path(root) / 'commitlog'})"
        )
    try:
        config = BrokerConfig(**values)
    except ConfigError as exc:
        spec = _BY_KEY.get(str(exc).split("=", 1)[0])
        if spec is None:
            raise
        # A value nobody set fails only a cross-check (brokerId=0 with brokerRole=SLAVE).
        where = source_of.get(spec.field, "defaults")
        raise ConfigError(f"{exc} (from {where})") from None
    return config


def _apply(
    values: dict[str, Any], source_of: dict[str, str], key: str, raw: object, where: str
) -> None:
    if key in _CONSUME_QUEUE_SIZE_KEYS:
        size = _parse_value(key, raw, parse_int, where)
        if size < CONSUME_QUEUE_ENTRY_SIZE or size % CONSUME_QUEUE_ENTRY_SIZE:
            raise ConfigError(
                f"{key}={raw!r}: must be a positive multiple of {CONSUME_QUEUE_ENTRY_SIZE} "
                f"(from {where})"
            )
        values["consume_queue_file_entries"] = size // CONSUME_QUEUE_ENTRY_SIZE
        source_of["consume_queue_file_entries"] = where
        return
    if key == "storePathCommitLog":
        values["_store_path_commit_log"] = _parse_value(key, raw, parse_path, where)
        return
    spec = _BY_KEY.get(key)
    if spec is None:
        if where == "override":
            raise ConfigError(f"unknown broker setting {key}{did_you_mean(key)}")
        log.warning("ignoring unknown broker setting %s (from %s)%s", key, where, did_you_mean(key))
        return
    _set(values, source_of, spec.field, raw, where, key, spec.parse)


def _set(
    values: dict[str, Any],
    source_of: dict[str, str],
    field_name: str,
    raw: object,
    where: str,
    key: str,
    parse: Callable[[str], Any] = parse_int,
) -> None:
    values[field_name] = _parse_value(key, raw, parse, where)
    source_of[field_name] = where


def _parse_value(key: str, raw: object, parse: Callable[[str], Any], where: str) -> Any:
    if not isinstance(raw, str):
        # Typed overrides (from argparse or tests) pass through when they already fit.
        if isinstance(raw, (list, tuple)):
            return tuple(str(x) for x in raw)
        if isinstance(raw, Path) or (isinstance(raw, (int, float)) and not isinstance(raw, bool)):
            raw = str(raw)
        elif isinstance(raw, bool):
            raw = "true" if raw else "false"
        else:
            raise ConfigError(f"{key}={raw!r}: unsupported value type (from {where})")
    try:
        return parse(raw)
    except ValueError as exc:
        raise ConfigError(f"{key}={raw!r}: {exc} (from {where})") from None


def render_config(cfg: BrokerConfig, *, comments: bool = True) -> str:
    """The effective values as broker.conf text, one `key=value` per setting."""
    lines: list[str] = []
    for spec in KEYS:
        if comments:
            lines.append(f"# {spec.comment}")
        lines.append(f"{spec.name}={spec.render(getattr(cfg, spec.field))}")
        if comments:
            lines.append("")
    if comments:
        lines.append(
            f"# Bytes per consume-queue file ({CONSUME_QUEUE_ENTRY_SIZE}-byte entries each)."
        )
    size = cfg.consume_queue_file_entries * CONSUME_QUEUE_ENTRY_SIZE
    lines.append(f"mappedFileSizeConsumeQueue={size}")
    return "\n".join(lines) + "\n"


def did_you_mean(key: str) -> str:
    """ ": did you mean brokerName?" for the known key nearest to `key`; "" if none is close."""
    by_lower = {known.lower(): known for known in known_keys()}
    close = difflib.get_close_matches(key.lower(), by_lower, n=1, cutoff=SUGGEST_RATIO_MIN)
    return f": did you mean {by_lower[close[0]]}?" if close else ""


def known_keys() -> Iterable[str]:
    """Every accepted RocketMQ key (for docs and tests)."""
    return [*_BY_KEY, *sorted(_SPECIAL_KEYS)]


EXAMPLE_STORE_DIR: Final = Path("/var/lib/tidemq/store")


def example_config() -> str:
    """The text of conf/broker.example.conf: every key at its default, commented in place."""
    header = (
        "# TideMQ broker configuration: RocketMQ's broker.conf format and key names.\n"
        "# Generated by tidemq.broker.config_file.example_config(); every value is the default\n"
        f"# except storePathRootDir: {EXAMPLE_STORE_DIR} here, ~/store when the key is absent\n"
        "# (as in RocketMQ). Unknown keys are logged and ignored.\n"
        "# Environment: TIDEMQ_<KEY_IN_UPPER_SNAKE_CASE> (e.g. TIDEMQ_LISTEN_PORT) and\n"
        "# NAMESRV_ADDR override this file; command-line flags override both.\n\n"
    )
    return header + render_config(BrokerConfig(store_path_root_dir=EXAMPLE_STORE_DIR))
