"""What dispatch derives from a record's properties: index keys and the consume-queue tags code.

Shared by the put path and recovery, so a record re-dispatched after a crash yields exactly the
entries it got when it was put.
"""

from __future__ import annotations

import functools
import logging
from typing import Final

from tidemq.protocol import message as props

logger = logging.getLogger(__name__)

# Kept in the record when a put names a tags code other than the TAGS hash (e.g. a delay
# topic's deliver time), so re-dispatch after a crash restores the same consume-queue entry.
TAGS_CODE_PROPERTY: Final = "__TAGSCODE#"
# Transaction type bits of sysFlag (§6.1): PREPARED and ROLLBACK records get no consume-queue
# entry, and ROLLBACK records no index entry either.
TX_MASK: Final = props.SysFlag.TRANSACTION_MASK
TX_PREPARED: Final = props.SysFlag.PREPARED
TX_ROLLBACK: Final = props.SysFlag.ROLLBACK


def index_keys(properties: dict[str, str]) -> list[str]:
    """KEYS (space-separated, empty ones skipped), then UNIQ_KEY unless already among them."""
    keys_text = properties.get(props.KEYS)
    uniq = properties.get(props.UNIQ_KEY)
    if not keys_text:  # most messages: no KEYS, only the client's UNIQ_KEY
        return [uniq] if uniq else []
    keys = [k for k in keys_text.split(" ") if k]
    if uniq and uniq not in keys:
        keys.append(uniq)
    return keys


def tags_code_of(properties: dict[str, str]) -> int:
    explicit = properties.get(TAGS_CODE_PROPERTY)
    if explicit is not None:
        try:
            return int(explicit)
        except ValueError:
            logger.warning("ignoring malformed %s=%r", TAGS_CODE_PROPERTY, explicit)
    tags = properties.get(props.TAGS)
    return tag_code(tags) if tags else 0


@functools.lru_cache(maxsize=4096)
def tag_code(tags: str) -> int:
    """`props.tag_code(tags)`, remembered: a topic's messages carry few distinct tags, and the
    Java hash is a Python loop over the tag's characters (a few µs; a hit costs ~0.1 µs)."""
    return props.tag_code(tags)
