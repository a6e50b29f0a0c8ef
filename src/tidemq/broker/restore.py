"""`message_from_stored`: a stored record turned back into a message to put again.

The delay levels, the timer wheel, transactions and send-back all re-store a record they read:
to its real topic when due or committed, as a half-message copy, or to a retry topic. What is
carried over and what is dropped is decided here once: the body, flag, born time and host travel
unchanged; the sys flag, store host and reconsume times travel unless the caller changes them; the
store's own properties (__CRC32#, __TAGSCODE#) are dropped because the store writes them afresh.
"""

from __future__ import annotations

from tidemq.protocol import record as rec
from tidemq.protocol.message import encode_properties
from tidemq.store.dispatch import TAGS_CODE_PROPERTY
from tidemq.store.types import MessageToStore


def message_from_stored(
    stored: rec.StoredMessage,
    *,
    topic: str,
    queue_id: int,
    properties: dict[str, str],
    sys_flag: int | None = None,
    store_host: tuple[str, int] | None = None,
    reconsume_times: int | None = None,
    prepared_transaction_offset: int = 0,
    store_timestamp: int | None = None,
) -> MessageToStore:
    """`stored` re-addressed to `topic`/`queue_id` with `properties` (the store's own removed).

    Args:
        stored: the record read back from the commit log.
        topic, queue_id: where the new message goes.
        properties: its user and system properties (this dict is not modified).
        sys_flag, store_host, reconsume_times: replacements; None keeps the record's.
        prepared_transaction_offset: the half message a committed message came from, else 0.
        store_timestamp: a store time to keep (half copies age from the prepare); None: now.
    """
    props = {k: v for k, v in properties.items() if k not in (rec.CRC_PROPERTY, TAGS_CODE_PROPERTY)}
    return MessageToStore(
        topic=topic,
        queue_id=queue_id,
        body=stored.body,
        flag=stored.flag,
        properties=encode_properties(props),
        sys_flag=stored.sys_flag if sys_flag is None else sys_flag,
        born_timestamp=stored.born_timestamp,
        born_host=stored.born_host,
        store_host=stored.store_host if store_host is None else store_host,
        reconsume_times=stored.reconsume_times if reconsume_times is None else reconsume_times,
        prepared_transaction_offset=prepared_transaction_offset,
        store_timestamp=store_timestamp,
    )
