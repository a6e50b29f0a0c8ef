"""The exactly-once sink's pure rules: which decision a commit finishes (eos_driver.choose) and
which failed half sends may be sent again (exactly_once.never_stored)."""

from __future__ import annotations

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from tidemq.errors import (
    ConnectFailedError,
    ConnectionClosedError,
    NoRouteError,
    RequestTimeoutError,
    error_for_code,
)
from tidemq.protocol.codes import ResponseCode
from tidemq.spark.eos_driver import BatchCommitError, BatchRef, Decision, choose
from tidemq.spark.exactly_once import never_stored

REF = BatchRef("q", 7)
OWN = Decision(frozenset({"0/0-new", "1/0-new"}), (("broker-a", "a:1"),))
FIRST = Decision(frozenset({"0/0-old", "1/0-old"}), (("broker-a", "a:1"), ("broker-c", "c:1")))
OTHER = Decision(frozenset({"0/1-old"}), (("broker-b", "b:1"),))
NONE = ("NONE", Decision(frozenset(), ()))


def test_a_fresh_batch_commits_its_own_attempt() -> None:
    assert choose(REF, OWN, {"broker-a": NONE, "broker-b": NONE}) == (OWN, False)
    assert choose(REF, OWN, {}) == (OWN, False)


def test_a_replay_finishes_the_earlier_decision_published_first() -> None:
    found = {"broker-a": ("COMMITTED", FIRST), "broker-b": ("DECIDED", OTHER), "c": NONE}
    assert choose(REF, OWN, found) == (FIRST, True)
    assert choose(REF, OWN, {"broker-b": ("DECIDED", OTHER), "broker-c": NONE}) == (OTHER, True)


def test_two_published_decisions_are_an_error() -> None:
    with pytest.raises(BatchCommitError, match="different txns"):
        choose(REF, OWN, {"broker-a": ("COMMITTED", FIRST), "broker-b": ("COMMITTED", OTHER)})


@pytest.mark.parametrize(
    ("error", "resend"),
    [
        (ConnectFailedError("connect to 127.0.0.1:1 failed"), True),
        (NoRouteError("no writable queue"), True),
        (error_for_code(ResponseCode.SYSTEM_BUSY), True),
        (error_for_code(ResponseCode.SERVICE_NOT_AVAILABLE), True),
        # Stored, or maybe stored: a resend could commit the row twice.
        (ConnectionClosedError("connection closed"), False),
        (RequestTimeoutError("timed out"), False),
        (error_for_code(ResponseCode.FLUSH_DISK_TIMEOUT), False),
        (error_for_code(ResponseCode.SLAVE_NOT_AVAILABLE), False),
        (error_for_code(ResponseCode.SYSTEM_ERROR), False),
    ],
)
def test_only_sends_that_stored_nothing_are_sent_again(error: Exception, resend: bool) -> None:
    assert never_stored(error) is resend


def test_a_stage_retry_gets_other_txn_ids() -> None:
    """Spark numbers task attempts per stage attempt: after a fetch failure the write stage is
    resubmitted and a partition's task runs as attempt 0 again, with the same writer (nonce).
    Its txn must differ from the first run's, whose halves (sent before the failure) would
    otherwise be committed with it."""
    from pyspark import TaskContext

    from tidemq.spark.exactly_once import task_tag
    from tidemq.spark.options import SinkOptions

    options = SinkOptions(name_server="127.0.0.1:9876", topic="T")
    tags = []
    for task_attempt_id in (17, 42):  # stage attempt 0, then 1: attemptNumber 0 both times
        context = TaskContext._getOrCreate()
        context._partitionId = 3
        context._attemptNumber = 0
        context._stageId = 5
        context._taskAttemptId = task_attempt_id
        context._localProperties = {"sql.streaming.queryId": "q", "streaming.sql.batchId": "2"}
        try:
            tags.append(task_tag(options, "job", "nonce"))
        finally:
            TaskContext._setTaskContext(None)  # type: ignore[arg-type]
    assert tags[0].value != tags[1].value
    assert all(tag.value.startswith("q/2/3/0-") for tag in tags)
