"""The driver side of the exactly-once sink: one batch ended on every broker, all or nothing.

The tasks report, in their commit messages, the brokers their halves went to (the holders). The
driver's `commit(N)` then runs the three steps of ARCHITECTURE.md ("Batch ends for the
exactly-once Spark sink") with TIDEMQ_END_BATCH COMMIT requests:

1. LOOKUP on every witness (the output topics' masters and the holders): has any broker
   recorded a decision for (sink, N)? A published one wins; else an unpublished one (several:
   the first by broker name, sent with `replace`); else this attempt's own txns and holders.
2. DECIDE that decision on every witness and every holder of it. Nothing is visible yet.
3. PUBLISH it on every broker that recorded it: each commits the listed halves it holds and
   rolls back the rest of the batch (this attempt's rows, when an earlier decision won).

A holder that does not answer a step fails the commit (BatchCommitError): Spark fails the
query, and the batch replayed after a restart finishes the same decision. A witness holding no
halves may be down (its failure is logged): it only makes the decision easier to find. A
refusal (the broker holds a contradicting decision) fails the commit, except one: a holder of
an earlier, unpublished decision that refuses it because it rolled back txns of it
(`batchRolledBack`: its orphan timeout ran out while the query was down) never recorded that
decision and never will, so no broker published it; the replay then decides its own txns.

`abort(N)` (Spark calls it after a failed commit too, with the same messages) sends ROLLBACK
only when every broker answers a lookup and none holds a decision of the batch: a broker's
ROLLBACK rolls back every pending half of the batch it holds, so on a holder that missed the
decide it would sink a decision the replay must finish.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import orjson
from pyspark.sql.datasource import WriterCommitMessage

from tidemq.client.blocking import BlockingAdmin
from tidemq.errors import BrokerError, ClientError, error_for_code
from tidemq.protocol.codes import RequestCode, ResponseCode
from tidemq.protocol.frame import RemotingCommand
from tidemq.protocol.headers import EndBatchRequestHeader
from tidemq.protocol.message import SysFlag

from .broker_access import CLIENTS
from .options import SinkOptions

logger = logging.getLogger(__name__)

# How long the driver waits for one broker's DECIDE, PUBLISH or ROLLBACK answer, in ms (the
# broker flushes its record, and on a publish the committed messages, under SYNC_FLUSH).
END_BATCH_TIMEOUT_MS: Final = 30_000
# How long a LOOKUP may take, in ms: a read of the broker's memory, no disk.
LOOKUP_TIMEOUT_MS: Final = 5_000

# name -> master address of brokers.
Brokers = Mapping[str, str]
# Fault-injection seam for tests: called with (step, broker name) before each request.
BeforeRequest = Callable[[str, str], None]


class BatchCommitError(RuntimeError):
    """The batch's decision did not reach every broker holding its halves (or contradicts a
    broker's records); the batch is not committed yet, and its replay finishes the decision."""


class HolderRolledBackError(BatchCommitError):
    """A broker holding halves of the decision refused it because it rolled back txns of it
    (its orphan timeout, or a ROLLBACK that reached it while the decide did not): it never
    recorded the decision and never will, so no broker can have published it."""


class DecisionRolledBackError(BrokerError):
    """TRANSACTION_FAILED with `batchRolledBack`: the broker rolled back txns the COMMIT lists."""

    code = ResponseCode.TRANSACTION_FAILED


@dataclass(frozen=True)
class EosCommitMessage(WriterCommitMessage):
    """What one successful exactly-once write task reports to the driver."""

    sink_id: str
    batch_id: int
    partition_id: int
    attempt: str
    rows: int
    topics: tuple[str, ...]
    brokers: tuple[tuple[str, str], ...] = ()  # (name, master address) the halves went to

    @property
    def txn(self) -> str:
        return f"{self.partition_id}/{self.attempt}"


@dataclass(frozen=True)
class Decision:
    """A batch's COMMIT decision: the txns to publish and the brokers holding their halves."""

    txns: frozenset[str]
    holders: tuple[tuple[str, str], ...]

    def body(self, step: str, *, replace: bool = False) -> dict[str, object]:
        body: dict[str, object] = {
            "phase": step,
            "txns": sorted(self.txns),
            "brokers": dict(self.holders),
        }
        if replace:
            body["replace"] = True
        return body


@dataclass(frozen=True)
class BatchRef:
    sink_id: str
    batch_id: int

    def __str__(self) -> str:
        return f"batch {self.batch_id} of sink {self.sink_id}"


def task_messages(
    messages: Sequence[WriterCommitMessage | None], batch_id: int | None
) -> tuple[BatchRef, list[EosCommitMessage]] | None:
    """The exactly-once messages and the batch they name (None when no task reported)."""
    done = [m for m in messages if isinstance(m, EosCommitMessage)]
    if not done:
        return None
    refs = {BatchRef(m.sink_id, m.batch_id) for m in done}
    if len(refs) != 1:
        raise RuntimeError(f"task messages name several batches: {sorted(map(str, refs))}")
    (ref,) = refs
    if batch_id is not None and batch_id != ref.batch_id:
        raise RuntimeError(f"tasks wrote batch {ref.batch_id}, the driver ends batch {batch_id}")
    return ref, done


def route_masters(admin: BlockingAdmin, topics: Iterable[str]) -> dict[str, str]:
    """name -> master address of every broker serving one of `topics` (a topic without a route
    yet adds none: the tasks' own reports name the brokers holding halves)."""
    masters: dict[str, str] = {}
    for topic in topics:
        try:
            route = admin.topic_route(topic)
        except BrokerError as exc:
            if exc.response_code != ResponseCode.TOPIC_NOT_EXIST:
                raise
            continue
        masters.update({b.broker_name: b.master_addr for b in route.broker_datas if b.master_addr})
    return masters


def end_batch_request(
    admin: BlockingAdmin,
    addr: str,
    ref: BatchRef,
    body: Mapping[str, object],
    *,
    commit: bool,
    timeout_ms: int = END_BATCH_TIMEOUT_MS,
) -> RemotingCommand:
    """One TIDEMQ_END_BATCH; the SUCCESS response. Raises BrokerError for a refusal and
    ClientError when the broker cannot be reached or does not answer in time."""
    header = EndBatchRequestHeader(
        sink_id=ref.sink_id,
        batch_id=ref.batch_id,
        commit_or_rollback=SysFlag.COMMIT if commit else SysFlag.ROLLBACK,
    )
    command = RemotingCommand(
        code=RequestCode.TIDEMQ_END_BATCH, ext_fields=header.to_fields(), body=orjson.dumps(body)
    )
    # BlockingAdmin has no public raw-request method; its loop runs the remoting call.
    response = admin._run(admin.admin.instance.remoting.invoke(addr, command, timeout_ms))
    if response.code != ResponseCode.SUCCESS:
        remark = f"END_BATCH of {ref} at {addr}: {response.remark}"
        if (response.ext_fields or {}).get("batchRolledBack") == "true":
            raise DecisionRolledBackError(remark)
        raise error_for_code(response.code, remark)
    return response


def parse_lookup(body: bytes) -> tuple[str, Decision]:
    """A LOOKUP answer: the state ("NONE", "DECIDED" or "COMMITTED") and the decision."""
    data = orjson.loads(body)
    brokers = data.get("brokers", {})
    return str(data["state"]), Decision(
        frozenset(str(txn) for txn in data.get("txns", [])),
        tuple(sorted((str(name), str(addr)) for name, addr in brokers.items())),
    )


def lookup(
    admin: BlockingAdmin, brokers: Brokers, ref: BatchRef
) -> dict[str, tuple[str, Decision]]:
    """Each reachable broker's record of the batch: (state, decision)."""
    found: dict[str, tuple[str, Decision]] = {}
    for name, addr in sorted(brokers.items()):
        try:
            response = end_batch_request(
                admin, addr, ref, {"phase": "lookup"}, commit=True, timeout_ms=LOOKUP_TIMEOUT_MS
            )
        except ClientError as exc:
            logger.warning("tidemq sink: no lookup of %s at %s (%s): %s", ref, name, addr, exc)
            continue
        found[name] = parse_lookup(response.body)
    return found


def choose(
    ref: BatchRef, own: Decision, found: Mapping[str, tuple[str, Decision]]
) -> tuple[Decision, bool]:
    """The decision to finish and whether it replaces unpublished ones (module docstring)."""
    published = {d.txns: d for _, (state, d) in sorted(found.items()) if state == "COMMITTED"}
    decided = {d.txns: d for _, (state, d) in sorted(found.items()) if state == "DECIDED"}
    if len(published) > 1:
        raise BatchCommitError(f"{ref} is committed with different txns on different brokers")
    earlier = next(iter(published.values()), None) or next(iter(decided.values()), None)
    if earlier is None:
        return own, False
    if earlier.txns != own.txns:
        logger.warning(
            "tidemq sink: %s was decided by an earlier attempt (%d txns on %s); finishing that "
            "decision, this attempt's rows roll back",
            ref,
            len(earlier.txns),
            [name for name, _ in earlier.holders],
        )
    # `replace`: brokers that recorded another, unpublished decision take this one instead.
    return earlier, True


def run_step(
    admin: BlockingAdmin,
    brokers: Brokers,
    ref: BatchRef,
    decision: Decision,
    step: str,
    *,
    replace: bool = False,
    before_request: BeforeRequest | None = None,
) -> dict[str, dict[str, str]]:
    """DECIDE or PUBLISH (`step`) on every broker; the answers of those that recorded it.
    Raises BatchCommitError when a holder of the decision did not, or any broker refused."""
    holders = {name for name, _ in decision.holders}
    answers: dict[str, dict[str, str]] = {}
    missing: list[str] = []
    for name, addr in sorted(brokers.items()):
        if before_request is not None:
            before_request(step, name)
        try:
            response = end_batch_request(
                admin, addr, ref, decision.body(step, replace=replace), commit=True
            )
        except BrokerError as exc:
            refused = f"{step} of {ref} refused by {name}: {exc}"
            if isinstance(exc, DecisionRolledBackError) and name in holders:
                raise HolderRolledBackError(refused) from exc
            raise BatchCommitError(refused) from exc
        except ClientError as exc:
            level = logging.ERROR if name in holders else logging.WARNING
            logger.log(level, "tidemq sink: %s of %s at %s (%s): %s", step, ref, name, addr, exc)
            if name in holders:
                missing.append(f"{name} ({exc})")
            continue
        answers[name] = dict(response.ext_fields)
    if missing:
        state = (
            f"the batch is visible on {sorted(answers)} only, until its replay publishes it on "
            "the rest"
            if step == "commit"
            else "this attempt published nothing (the batch's replay finishes the decision)"
        )
        raise BatchCommitError(
            f"{step} of {ref} did not reach brokers holding its halves: {', '.join(missing)}; "
            f"{state}"
        )
    return answers


def commit_batch(
    options: SinkOptions,
    messages: Sequence[WriterCommitMessage | None],
    batch_id: int | None,
    *,
    before_request: BeforeRequest | None = None,
) -> dict[str, dict[str, str]]:
    """The driver's commit (module docstring); returns each broker's PUBLISH answer fields.
    Raises BatchCommitError unless every broker holding halves of the decision published it."""
    reported = task_messages(messages, batch_id)
    if reported is None:
        return {}
    ref, done = reported
    holders = dict(pair for m in done for pair in m.brokers)
    own = Decision(frozenset(m.txn for m in done), tuple(sorted(holders.items())))
    admin = CLIENTS.get(options.name_server, credentials=options.credentials, tls=options.tls).admin
    live = route_masters(admin, sorted({t for m in done for t in m.topics}))
    witnesses = {**holders, **live}
    found = lookup(admin, witnesses, ref)
    decision, replace = choose(ref, own, found)

    def decide(decision: Decision, replace: bool) -> tuple[dict[str, str], dict[str, object]]:
        targets = {**dict(decision.holders), **witnesses}
        answers = run_step(
            admin, targets, ref, decision, "decide", replace=replace, before_request=before_request
        )
        return targets, dict(answers)

    try:
        targets, decided = decide(decision, replace)
    except HolderRolledBackError as exc:
        # An earlier attempt's unpublished decision that one of its holders can never record
        # was published nowhere: this attempt's rows replace it (`replace`). Never when it was
        # found published (then that holder lost its records: the commit must fail).
        if decision.txns == own.txns or any(state == "COMMITTED" for state, _ in found.values()):
            raise
        logger.warning(
            "tidemq sink: %s: the earlier decision can never be published (%s); deciding this "
            "attempt's txns instead",
            ref,
            exc,
        )
        decision = own
        targets, decided = decide(decision, True)
    published = {name: targets[name] for name in decided}
    answers = run_step(admin, published, ref, decision, "commit", before_request=before_request)
    logger.info(
        "tidemq sink committed %s: %d txns (%s), %d rows reported by %d tasks, brokers %s",
        ref,
        len(decision.txns),
        "this attempt's" if decision.txns == own.txns else "an earlier attempt's",
        sum(m.rows for m in done),
        len(done),
        answers,
    )
    return answers


def abort_batch(
    options: SinkOptions, messages: Sequence[WriterCommitMessage | None], batch_id: int
) -> None:
    """Roll back this attempt's txns wherever its halves may be, unless a decision of the
    batch may be recorded somewhere (a broker answers one to the lookup, or does not answer):
    then nothing is sent, and the replay's publish or the brokers' records resolve the halves.
    Never raises for a broker."""
    reported = task_messages(messages, batch_id)
    if reported is None:
        logger.warning(
            "tidemq sink aborted batch %s with no task message; its halves stay invisible and "
            "the brokers roll them back from their batch records",
            batch_id,
        )
        return
    ref, done = reported
    admin = CLIENTS.get(options.name_server, credentials=options.credentials, tls=options.tls).admin
    brokers = dict(pair for m in done for pair in m.brokers)
    try:
        brokers.update(route_masters(admin, sorted({t for m in done for t in m.topics})))
        found = lookup(admin, brokers, ref)
    except (BrokerError, ClientError) as exc:
        logger.warning("tidemq sink: %s not rolled back (no lookup: %s)", ref, exc)
        return
    # A broker's ROLLBACK also rolls back every other pending half of the batch it holds, and
    # a broker that rolled back a txn refuses to decide it. So while a decision of the batch
    # may be recorded anywhere (found, or on a broker that did not answer), a ROLLBACK here
    # could sink that decision for good on a holder that missed its decide (a commit that
    # failed there, then this abort): the replay could then never finish it. Leave the halves
    # to the replay's publish and the brokers' records instead.
    decided = sorted(name for name, (state, _) in found.items() if state != "NONE")
    unanswered = sorted(set(brokers) - set(found))
    if decided or unanswered:
        logger.warning(
            "tidemq sink: %s not rolled back: %s; its replay finishes the decision or "
            "decides anew, and the brokers resolve the halves from their records",
            ref,
            f"decided on {decided}" if decided else f"no lookup answer from {unanswered}",
        )
        return
    body = {"txns": sorted(m.txn for m in done)}
    for name, addr in sorted(brokers.items()):
        try:
            end_batch_request(admin, addr, ref, body, commit=False)
        except (BrokerError, ClientError) as exc:
            logger.warning("tidemq sink: rollback of %s at %s: %s", ref, name, exc)
    logger.info("tidemq sink rolled back %s (%d task messages)", ref, len(done))


def abort_write_job(
    options: SinkOptions, messages: Sequence[WriterCommitMessage | None], sink_id: str
) -> dict[str, dict[str, str]]:
    """Close batch 0 of a batch write's sink for good on every master of the cluster (a batch
    write is never replayed, and Spark's killed tasks may send halves after the abort), whether
    or not any task reported."""
    done = [m for m in messages if isinstance(m, EosCommitMessage)]
    if any(m.sink_id != sink_id or m.batch_id != 0 for m in done):
        raise RuntimeError(f"tasks wrote another sink than {sink_id}/0")
    admin = CLIENTS.get(options.name_server, credentials=options.credentials, tls=options.tls).admin
    addrs = sorted(
        {b.master_addr for b in admin.cluster_info().broker_addr_table.values() if b.master_addr}
    )
    ref = BatchRef(sink_id, 0)
    body = {"txns": sorted(m.txn for m in done), "final": True}
    answers: dict[str, dict[str, str]] = {}
    for addr in addrs:
        # Every master is tried: one that refuses (it published the write before the commit
        # failed) or is down must not leave the others open to the killed tasks' late halves.
        try:
            answers[addr] = dict(end_batch_request(admin, addr, ref, body, commit=False).ext_fields)
        except (BrokerError, ClientError) as exc:
            logger.warning("tidemq sink: final rollback of write %s at %s: %s", sink_id, addr, exc)
    logger.info(
        "tidemq sink rolled back write %s for good (%d task messages), brokers %s",
        sink_id,
        len(done),
        answers,
    )
    return answers
