"""Typed headers of transactions (remoting.md §4.11): END_TRANSACTION, CHECK_TRANSACTION_STATE
and TideMQ's END_BATCH for the exactly-once Spark sink. Conventions as in headers_send.py.

END_TRANSACTION is one request per transaction on the producer's hot path: its careful parse and
its fast path are one `EndTransactionRequestHeader.from_fields`, and `end_transaction_fields` is
the one spelling of its fields (`to_fields` without the header object).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Self

from tidemq.protocol._fields import PLAIN_BOOLS, FieldReader, parse_plain_int, render


@dataclass(frozen=True, slots=True, kw_only=True)
class EndTransactionRequestHeader:
    """commit_or_rollback holds the sysFlag transaction value: 0 NOT, 8 COMMIT, 12 ROLLBACK."""

    producer_group: str
    tran_state_table_offset: int
    commit_log_offset: int
    commit_or_rollback: int
    from_transaction_check: bool = False
    msg_id: str
    transaction_id: str | None = None

    def to_fields(self) -> dict[str, str]:
        return end_transaction_fields(
            self.producer_group,
            self.tran_state_table_offset,
            self.commit_log_offset,
            self.commit_or_rollback,
            self.msg_id,
            self.transaction_id,
            from_transaction_check=self.from_transaction_check,
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        get = fields.get
        group, msg_id = get("producerGroup"), get("msgId")
        table, offset, action = (
            get("tranStateTableOffset"),
            get("commitLogOffset"),
            get("commitOrRollback"),
        )
        from_check = PLAIN_BOOLS.get(get("fromTransactionCheck") or "false")
        if (  # the hot path (one per transaction): what every client sends
            group is not None
            and msg_id is not None
            and from_check is not None
            and table is not None
            and offset is not None
            and action is not None
            and (table_offset := parse_plain_int(table)) is not None
            and (log_offset := parse_plain_int(offset)) is not None
            and (outcome := parse_plain_int(action)) is not None
        ):
            return cls(
                producer_group=group,
                tran_state_table_offset=table_offset,
                commit_log_offset=log_offset,
                commit_or_rollback=outcome,
                from_transaction_check=from_check,
                msg_id=msg_id,
                transaction_id=get("transactionId") or None,
            )
        return cls._from_fields_careful(fields)

    @classmethod
    def _from_fields_careful(cls, fields: Mapping[str, str]) -> Self:
        """Any spelling FieldReader accepts; names the field that is wrong."""
        r = FieldReader(cls.__name__, fields)
        return cls(
            producer_group=r.req_str("producerGroup"),
            tran_state_table_offset=r.req_int("tranStateTableOffset"),
            commit_log_offset=r.req_int("commitLogOffset"),
            commit_or_rollback=r.req_int("commitOrRollback"),
            from_transaction_check=r.bool_or("fromTransactionCheck", False),
            msg_id=r.req_str("msgId"),
            transaction_id=r.opt_str_nonempty("transactionId"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class EndBatchRequestHeader:
    """TIDEMQ_END_BATCH (TideMQ-private): end every half message of one sink batch.

    commit_or_rollback holds the sysFlag transaction value as END_TRANSACTION's does: 8 COMMIT,
    12 ROLLBACK. The body is JSON `{"txns": ["<partition>/<attempt>", ...]}`.
    """

    sink_id: str
    batch_id: int
    commit_or_rollback: int

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "sinkId": self.sink_id,
                "batchId": self.batch_id,
                "commitOrRollback": self.commit_or_rollback,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            sink_id=r.req_str("sinkId"),
            batch_id=r.req_int("batchId"),
            commit_or_rollback=r.req_int("commitOrRollback"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckTransactionStateRequestHeader:
    """Broker → producer (oneway); the offsets are those of the half message's check copy."""

    tran_state_table_offset: int
    commit_log_offset: int
    msg_id: str | None = None
    transaction_id: str | None = None
    offset_msg_id: str | None = None

    def to_fields(self) -> dict[str, str]:
        return render(
            {
                "tranStateTableOffset": self.tran_state_table_offset,
                "commitLogOffset": self.commit_log_offset,
                "msgId": self.msg_id,
                "transactionId": self.transaction_id,
                "offsetMsgId": self.offset_msg_id,
            }
        )

    @classmethod
    def from_fields(cls, fields: Mapping[str, str]) -> Self:
        r = FieldReader(cls.__name__, fields)
        return cls(
            tran_state_table_offset=r.req_int("tranStateTableOffset"),
            commit_log_offset=r.req_int("commitLogOffset"),
            msg_id=r.opt_str("msgId"),
            transaction_id=r.opt_str("transactionId"),
            offset_msg_id=r.opt_str("offsetMsgId"),
        )


def end_transaction_fields(
    producer_group: str,
    tran_state_table_offset: int,
    commit_log_offset: int,
    commit_or_rollback: int,
    msg_id: str,
    transaction_id: str | None,
    *,
    from_transaction_check: bool = False,
) -> dict[str, str]:
    """`EndTransactionRequestHeader(...).to_fields()` without the header object (a producer
    sends one per transaction): the one spelling of END_TRANSACTION's fields."""
    fields = {
        "producerGroup": producer_group,
        "tranStateTableOffset": str(tran_state_table_offset),
        "commitLogOffset": str(commit_log_offset),
        "commitOrRollback": str(commit_or_rollback),
        "fromTransactionCheck": "true" if from_transaction_check else "false",
        "msgId": msg_id,
    }
    if transaction_id is not None:
        fields["transactionId"] = transaction_id
    return fields
