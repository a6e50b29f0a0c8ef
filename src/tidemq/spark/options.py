"""The connector's options: parsed once, on the driver, into frozen dataclasses.

Spark hands a data source a case-insensitive map of strings whose copies have lowercased keys,
so every lookup here is by lowercased name. Names follow Spark's Kafka connector where the concept
is the same (`startingOffsets`, `maxOffsetsPerTrigger`, `failOnDataLoss`, ...); RocketMQ's own
spellings are accepted as aliases (`namesrvAddr`, `subExpression`).

Errors are `ValueError`s that name the option, raised before any query starts.

`accessKey` / `secretKey` (the names RocketMQ's own connectors use) sign every request the
connector's clients send, on the driver and the executors, for brokers with ACL. The secret is
kept only inside a Credentials, whose repr hides it, so neither the parsed options nor an error
shows it; Spark itself redacts option values whose key matches `spark.redaction.regex` (default
`(?i)secret|password|token|access[.]?key`) in the plans it prints.

`tls=true` dials name servers and brokers in TLS (docs/security.md), the servers verified
against the system's CA store, or against `tlsTrustCertPath`; `tlsCertPath` / `tlsKeyPath` (and
`tlsKeyPassword`, redacted by the same regex) are a client certificate for mutual TLS. A path
implies `tls=true`. The files are read on the driver when the options are parsed (a bad one is
an error naming its option) and again on each executor: the same paths on every node.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from tidemq.client import Credentials
from tidemq.limits import PULL_MESSAGE_COUNT_MAX
from tidemq.protocol import message as pm
from tidemq.security.tls import TlsClientSettings, TlsConfigError, client_context

# Spark Kafka's default for maxTriggerDelay.
MAX_TRIGGER_DELAY_MS_DEFAULT: Final = 15 * 60 * 1000
# Rows per Arrow record batch leaving read(); the spec measured ~10 k as the sweet spot.
ARROW_BATCH_ROWS_DEFAULT: Final = 10_000
ARROW_BATCH_ROWS_MAX: Final = 1_000_000
# Offsets asked for per pull; the broker's cap.
PULL_BATCH_SIZE_DEFAULT: Final = PULL_MESSAGE_COUNT_MAX

EARLIEST: Final = -2
LATEST: Final = -1

_DURATION = re.compile(r"\s*(\d+)\s*(ms|s|m|min|h|d)?\s*")
_DURATION_UNIT_MS: Final = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000}
_DURATION_UNIT_MS["d"] = 24 * _DURATION_UNIT_MS["h"]

# {topic: {brokerName: {queueId: value}}}, the shape of every per-queue JSON option.
QueueSpec = dict[str, dict[str, dict[int, int]]]


def _get(options: Mapping[str, str], *names: str) -> str | None:
    lowered = {key.lower(): value for key, value in options.items()}
    for name in names:
        value = lowered.get(name.lower())
        if value is not None and value != "":
            return str(value)
    return None


def parse_bool(name: str, value: str | None, default: bool) -> bool:
    if value is None:
        return default
    lowered = value.strip().lower()
    if lowered in ("true", "1", "yes"):
        return True
    if lowered in ("false", "0", "no"):
        return False
    raise ValueError(f"option {name} must be true or false, got {value!r}")


def parse_positive_int(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"option {name} must be an integer, got {value!r}") from None
    if number <= 0:
        raise ValueError(f"option {name} must be > 0, got {number}")
    return number


def parse_duration_ms(name: str, value: str | None, default: int) -> int:
    """ "15m", "30s", "500ms", "1h", "2d"; a bare number is milliseconds."""
    if value is None:
        return default
    match = _DURATION.fullmatch(value)
    if match is None:
        raise ValueError(f"option {name} must be a duration such as 30s or 15m, got {value!r}")
    return int(match.group(1)) * _DURATION_UNIT_MS[match.group(2) or "ms"]


def parse_queue_spec(name: str, value: str) -> QueueSpec:
    """A JSON object {topic: {brokerName: {queueId: number}}} with integer leaves."""
    try:
        raw: Any = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"option {name} is not valid JSON: {exc}") from None
    spec: QueueSpec = {}
    shape = f"option {name} must look like {{topic: {{brokerName: {{queueId: number}}}}}}"
    if not isinstance(raw, dict):
        raise ValueError(shape)
    for topic, brokers in raw.items():
        if not isinstance(brokers, dict):
            raise ValueError(shape)
        for broker, queues in brokers.items():
            if not isinstance(queues, dict):
                raise ValueError(shape)
            for queue_id, number in queues.items():
                if isinstance(number, bool) or not isinstance(number, int):
                    raise ValueError(f"{shape}; {topic}/{broker}/{queue_id} is {number!r}")
                try:
                    qid = int(queue_id)
                except ValueError:
                    raise ValueError(f"{shape}; queue id {queue_id!r} is not a number") from None
                spec.setdefault(topic, {}).setdefault(broker, {})[qid] = number
    return spec


def parse_credentials(options: Mapping[str, str]) -> Credentials | None:
    """`accessKey` and `secretKey`: both (an ACL account) or neither (unsigned requests). An
    error names the missing option, never a value."""
    access_key = _get(options, "accessKey")
    secret_key = _get(options, "secretKey")
    if access_key is None and secret_key is None:
        return None
    if access_key is None or secret_key is None:
        missing = "accessKey" if access_key is None else "secretKey"
        raise ValueError(f"options accessKey and secretKey go together: {missing} is missing")
    return Credentials(access_key, secret_key)


# The option of each TLS setting, for errors (security/tls.py names upstream's keys).
_TLS_OPTIONS: Final = {
    "tls.client.trustCertPath": "tlsTrustCertPath",
    "tls.client.certPath": "tlsCertPath",
    "tls.client.keyPath": "tlsKeyPath",
    "tls.client.keyPassword": "tlsKeyPassword",
}


def parse_tls(options: Mapping[str, str]) -> TlsClientSettings | None:
    """`tls` and the tls* paths (module docstring): the clients' TLS, None for plaintext. The
    files are read now; an error names the option, never the key password."""
    paths = {
        name: _get(options, name) for name in ("tlsTrustCertPath", "tlsCertPath", "tlsKeyPath")
    }
    given = [name for name, value in paths.items() if value is not None]
    if not parse_bool("tls", _get(options, "tls"), default=bool(given)):
        if given:
            raise ValueError(f"option tls=false contradicts option {given[0]}")
        return None
    trust, cert, key = (Path(value) if value else None for value in paths.values())
    try:
        settings = TlsClientSettings(
            trust_cert_path=trust,
            cert_path=cert,
            key_path=key,
            key_password=_get(options, "tlsKeyPassword") or "",
        )
        client_context(settings)
    except TlsConfigError as exc:
        message = str(exc)
        for setting, option in _TLS_OPTIONS.items():
            message = message.replace(setting, f"option {option}")
        raise ValueError(message) from None
    return settings


@dataclass(frozen=True, slots=True)
class OffsetChoice:
    """Where to start or end: `earliest`/`latest`, a per-queue spec of offsets (-2 earliest,
    -1 latest), a timestamp for every queue, or a per-queue spec of timestamps."""

    kind: str  # "earliest" | "latest" | "offsets" | "timestamp" | "timestamps"
    spec: QueueSpec | None = None
    timestamp_ms: int | None = None


def _parse_choice(
    options: Mapping[str, str], prefix: str, default: str, *, allow: tuple[str, ...]
) -> OffsetChoice:
    offsets = _get(options, f"{prefix}Offsets")
    timestamp = _get(options, f"{prefix}Timestamp")
    by_timestamp = _get(options, f"{prefix}OffsetsByTimestamp")
    given = [value for value in (offsets, timestamp, by_timestamp) if value is not None]
    if len(given) > 1:
        raise ValueError(
            f"give only one of {prefix}Offsets, {prefix}Timestamp and {prefix}OffsetsByTimestamp"
        )
    if timestamp is not None:
        try:
            return OffsetChoice("timestamp", timestamp_ms=int(timestamp))
        except ValueError:
            raise ValueError(
                f"option {prefix}Timestamp must be epoch milliseconds, got {timestamp!r}"
            ) from None
    if by_timestamp is not None:
        return OffsetChoice(
            "timestamps", spec=parse_queue_spec(f"{prefix}OffsetsByTimestamp", by_timestamp)
        )
    word = (offsets or default).strip()
    if word.lower() in ("earliest", "latest"):
        if word.lower() not in allow:
            raise ValueError(f"option {prefix}Offsets may not be {word.lower()} here")
        return OffsetChoice(word.lower())
    return OffsetChoice("offsets", spec=parse_queue_spec(f"{prefix}Offsets", word))


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Everything the source needs, validated."""

    name_server: str
    topics: tuple[str, ...] = ()
    topic_pattern: str | None = None
    tags: str = "*"
    starting: OffsetChoice = OffsetChoice("latest")
    ending: OffsetChoice = OffsetChoice("latest")
    timestamp_no_match_latest: bool = False  # startingOffsetsByTimestampStrategy=latest
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = MAX_TRIGGER_DELAY_MS_DEFAULT
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    fail_on_data_loss: bool = True
    include_properties: bool = False
    consumer_group: str | None = None
    pull_batch_size: int = PULL_BATCH_SIZE_DEFAULT
    arrow_batch_rows: int = ARROW_BATCH_ROWS_DEFAULT
    credentials: Credentials | None = None  # accessKey / secretKey (repr hides the secret)
    tls: TlsClientSettings | None = None  # tls, tlsTrustCertPath, ... (None: plaintext)

    def matches_topic(self, topic: str) -> bool:
        """True for a topic this source reads; system, retry and DLQ topics never match."""
        if is_hidden_topic(topic):
            return False
        if self.topic_pattern is not None:
            return re.fullmatch(self.topic_pattern, topic) is not None
        return topic in self.topics


def is_hidden_topic(topic: str) -> bool:
    """Topics holding uncommitted, internal or redelivered messages: never read as data."""
    return (
        pm.is_system_topic(topic)
        or topic == pm.TBW102
        or topic.lower().startswith(pm.SYSTEM_TOPIC_PREFIX)
        or pm.is_retry_topic(topic)
        or pm.is_dlq_topic(topic)
        or topic in (pm.RMQ_SYS_TRACE_TOPIC, pm.BENCHMARK_TOPIC)
    )


def _parse_topics(options: Mapping[str, str]) -> tuple[tuple[str, ...], str | None]:
    topic = _get(options, "topic")
    topics = _get(options, "topics")
    pattern = _get(options, "topicPattern")
    if sum(value is not None for value in (topic, topics, pattern)) != 1:
        raise ValueError("give exactly one of the options topic, topics and topicPattern")
    if pattern is not None:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"option topicPattern is not a regular expression: {exc}") from None
        return (), pattern
    names = tuple(
        sorted({name.strip() for name in (topic or topics or "").split(",") if name.strip()})
    )
    if not names:
        raise ValueError("options topic/topics name no topic")
    for name in names:
        pm.validate_topic(name)
        if is_hidden_topic(name):
            raise ValueError(f"topic {name!r} is a system topic; the connector never reads it")
    return names, None


def _consumer_group(options: Mapping[str, str]) -> str | None:
    group = _get(options, "consumerGroup")
    if group is not None:
        pm.validate_group(group)
    return group


def parse_source_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Validate the reader options of `spark.read` (streaming=False) or `spark.readStream`.

    Raises:
        ValueError: a missing, malformed or contradictory option, named in the message.
    """
    name_server = _get(options, "nameServer", "namesrvAddr")
    if name_server is None:
        raise ValueError("option nameServer (host:port[;host:port]) is required")
    topics, pattern = _parse_topics(options)
    starting = _parse_choice(
        options,
        "starting",
        "latest" if streaming else "earliest",
        allow=("earliest", "latest") if streaming else ("earliest",),
    )
    has_ending = any(
        _get(options, f"ending{suffix}") is not None
        for suffix in ("Offsets", "Timestamp", "OffsetsByTimestamp")
    )
    if streaming and has_ending:
        raise ValueError("endingOffsets is for batch queries only")
    ending = _parse_choice(options, "ending", "latest", allow=("latest",))
    strategy = (_get(options, "startingOffsetsByTimestampStrategy") or "error").lower()
    if strategy not in ("error", "latest"):
        raise ValueError("option startingOffsetsByTimestampStrategy must be error or latest")
    max_per_trigger = parse_positive_int(
        "maxOffsetsPerTrigger", _get(options, "maxOffsetsPerTrigger")
    )
    min_per_trigger = parse_positive_int(
        "minOffsetsPerTrigger", _get(options, "minOffsetsPerTrigger")
    )
    if max_per_trigger and min_per_trigger and min_per_trigger > max_per_trigger:
        raise ValueError("option minOffsetsPerTrigger may not exceed maxOffsetsPerTrigger")
    pull_batch = parse_positive_int("pullBatchSize", _get(options, "pullBatchSize"))
    if pull_batch is not None and pull_batch > PULL_MESSAGE_COUNT_MAX:
        raise ValueError(f"option pullBatchSize may not exceed {PULL_MESSAGE_COUNT_MAX}")
    arrow_rows = parse_positive_int("arrowBatchRows", _get(options, "arrowBatchRows"))
    if arrow_rows is not None and arrow_rows > ARROW_BATCH_ROWS_MAX:
        raise ValueError(f"option arrowBatchRows may not exceed {ARROW_BATCH_ROWS_MAX}")
    return SourceOptions(
        name_server=name_server,
        topics=topics,
        topic_pattern=pattern,
        tags=_get(options, "tags", "subExpression") or "*",
        starting=starting,
        ending=ending,
        timestamp_no_match_latest=strategy == "latest",
        max_offsets_per_trigger=max_per_trigger,
        min_offsets_per_trigger=min_per_trigger,
        max_trigger_delay_ms=parse_duration_ms(
            "maxTriggerDelay", _get(options, "maxTriggerDelay"), MAX_TRIGGER_DELAY_MS_DEFAULT
        ),
        min_partitions=parse_positive_int("minPartitions", _get(options, "minPartitions")),
        max_records_per_partition=parse_positive_int(
            "maxRecordsPerPartition", _get(options, "maxRecordsPerPartition")
        ),
        fail_on_data_loss=parse_bool(
            "failOnDataLoss", _get(options, "failOnDataLoss"), default=True
        ),
        include_properties=parse_bool(
            "includeProperties", _get(options, "includeProperties"), default=False
        ),
        consumer_group=_consumer_group(options),
        pull_batch_size=pull_batch or PULL_BATCH_SIZE_DEFAULT,
        arrow_batch_rows=arrow_rows or ARROW_BATCH_ROWS_DEFAULT,
        credentials=parse_credentials(options),
        tls=parse_tls(options),
    )


PRODUCER_GROUP_DEFAULT: Final = "TIDEMQ_SPARK_SINK"
# Messages per SEND_BATCH_MESSAGE from the at-least-once sink: a larger batch amortises the round
# trip; the cap keeps one batch well under the 4 MiB message size limit for small rows.
SEND_BATCH_SIZE_DEFAULT: Final = 128
SEND_BATCH_SIZE_MAX: Final = 1024


@dataclass(frozen=True, slots=True)
class SinkOptions:
    name_server: str
    topic: str | None = None
    exactly_once: bool = True
    producer_group: str = PRODUCER_GROUP_DEFAULT
    send_batch_size: int = SEND_BATCH_SIZE_DEFAULT
    sink_id: str | None = None  # exactly once: prefixes the query id (never replaces it)
    credentials: Credentials | None = None  # accessKey / secretKey (repr hides the secret)
    tls: TlsClientSettings | None = None  # tls, tlsTrustCertPath, ... (None: plaintext)


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """Validate the writer options of `df.write` / `df.writeStream`.

    Raises:
        ValueError: a missing or malformed option, named in the message.
    """
    name_server = _get(options, "nameServer", "namesrvAddr")
    if name_server is None:
        raise ValueError("option nameServer (host:port[;host:port]) is required")
    topic = _get(options, "topic")
    if topic is not None:
        pm.validate_topic(topic)
        if is_hidden_topic(topic):
            raise ValueError(f"option topic names the system topic {topic!r}")
    group = _get(options, "producerGroup") or PRODUCER_GROUP_DEFAULT
    pm.validate_group(group)
    batch = parse_positive_int("sendBatchSize", _get(options, "sendBatchSize"))
    if batch is not None and batch > SEND_BATCH_SIZE_MAX:
        raise ValueError(f"option sendBatchSize may not exceed {SEND_BATCH_SIZE_MAX}")
    sink_id = _get(options, "sinkId")
    if sink_id is not None and (not sink_id or "/" in sink_id or ":" in sink_id):
        raise ValueError("option sinkId must be non-empty and hold neither '/' nor ':'")
    return SinkOptions(
        name_server=name_server,
        topic=topic,
        exactly_once=parse_bool("exactlyOnce", _get(options, "exactlyOnce"), default=True),
        producer_group=group,
        send_batch_size=batch or SEND_BATCH_SIZE_DEFAULT,
        sink_id=sink_id,
        credentials=parse_credentials(options),
        tls=parse_tls(options),
    )
