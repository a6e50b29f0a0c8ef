"""The name server's namespaced key-value store (PUT/GET/DELETE_KV_CONFIG, GET_KVLIST_BY_NAMESPACE).

RocketMQ keeps small cluster-wide settings here, notably namespace ORDER_TOPIC_CONFIG
("topic" → "broker-a:4;broker-b:4"), which REGISTER_BROKER answers with. With a path configured
the table persists after every change as RocketMQ's kvConfig.json:

    {"configTable": {"<namespace>": {"<key>": "<value>", ...}, ...}}

written to a temporary file and renamed over the old one, so a crash leaves either version. The
file is small and changes rarely (operator commands), so it is written synchronously.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import orjson

logger = logging.getLogger(__name__)


class KVStore:
    """namespace → key → value, optionally persisted to `path`."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._table: dict[str, dict[str, str]] = {}

    def load(self) -> None:
        """Read the persisted table, if there is one. A corrupt file is logged and ignored (the
        table is rebuilt by operators; refusing to start would take routing down with it)."""
        if self._path is None or not self._path.exists():
            return
        try:
            document = orjson.loads(self._path.read_bytes())
            table = document.get("configTable", {}) if isinstance(document, dict) else {}
            self._table = {
                str(namespace): {str(k): str(v) for k, v in entries.items()}
                for namespace, entries in table.items()
                if isinstance(entries, dict)
            }
        except (orjson.JSONDecodeError, AttributeError) as exc:
            logger.warning("ignoring unreadable KV config %s: %s", self._path, exc)
            return
        logger.info("loaded %d KV namespaces from %s", len(self._table), self._path)

    def put(self, namespace: str, key: str, value: str) -> None:
        self._table.setdefault(namespace, {})[key] = value
        self._persist()

    def get(self, namespace: str, key: str) -> str | None:
        return self._table.get(namespace, {}).get(key)

    def delete(self, namespace: str, key: str) -> None:
        entries = self._table.get(namespace)
        if entries is None or key not in entries:
            return
        del entries[key]
        if not entries:
            del self._table[namespace]
        self._persist()

    def namespace(self, namespace: str) -> dict[str, str] | None:
        """A copy of one namespace's entries, or None when it has none."""
        entries = self._table.get(namespace)
        return dict(entries) if entries else None

    def _persist(self) -> None:
        if self._path is None:
            return
        self._path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self._path.with_name(self._path.name + ".tmp")
        data = orjson.dumps({"configTable": self._table}, option=orjson.OPT_INDENT_2)
        with temporary.open("wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        temporary.replace(self._path)
