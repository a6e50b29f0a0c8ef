"""Option parsing: names, aliases, defaults and the errors that name the option."""

from __future__ import annotations

import pytest

from tidemq.spark.options import (
    MAX_TRIGGER_DELAY_MS_DEFAULT,
    parse_duration_ms,
    parse_sink_options,
    parse_source_options,
)

NS = {"nameserver": "127.0.0.1:9876"}


def test_defaults_batch_and_stream() -> None:
    batch = parse_source_options({**NS, "topic": "T"}, streaming=False)
    assert batch.starting.kind == "earliest"
    assert batch.ending.kind == "latest"
    assert batch.fail_on_data_loss
    assert not batch.include_properties
    assert batch.tags == "*"
    stream = parse_source_options({**NS, "topic": "T"}, streaming=True)
    assert stream.starting.kind == "latest"
    assert stream.max_trigger_delay_ms == MAX_TRIGGER_DELAY_MS_DEFAULT


def test_keys_are_case_insensitive_and_aliases_work() -> None:
    parsed = parse_source_options(
        {"namesrvAddr": "h:1", "TOPICS": "B, A", "subExpression": "x || y"}, streaming=True
    )
    assert parsed.name_server == "h:1"
    assert parsed.topics == ("A", "B")
    assert parsed.tags == "x || y"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topic": "T"}, "nameServer"),
        ({**NS}, "exactly one of the options topic"),
        ({**NS, "topic": "T", "topicPattern": "T.*"}, "exactly one"),
        ({**NS, "topic": "RMQ_SYS_TRANS_HALF_TOPIC"}, "system topic"),
        ({**NS, "topic": "%RETRY%g"}, "system topic"),
        ({**NS, "topic": "T", "startingOffsets": "{bad"}, "startingOffsets is not valid JSON"),
        ({**NS, "topic": "T", "startingOffsets": "latest"}, "may not be latest"),
        ({**NS, "topic": "T", "endingOffsets": "earliest"}, "may not be earliest"),
        ({**NS, "topic": "T", "startingTimestamp": "x"}, "startingTimestamp"),
        ({**NS, "topic": "T", "failOnDataLoss": "maybe"}, "failOnDataLoss"),
        ({**NS, "topic": "T", "minPartitions": "0"}, "minPartitions"),
        (
            {**NS, "topic": "T", "startingTimestamp": "1", "startingOffsets": "earliest"},
            "only one",
        ),
    ],
)
def test_batch_option_errors_name_the_option(options: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_source_options(options, streaming=False)


def test_stream_refuses_ending_offsets_and_min_above_max() -> None:
    with pytest.raises(ValueError, match="endingOffsets"):
        parse_source_options({**NS, "topic": "T", "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(ValueError, match="minOffsetsPerTrigger"):
        parse_source_options(
            {**NS, "topic": "T", "minOffsetsPerTrigger": "10", "maxOffsetsPerTrigger": "5"},
            streaming=True,
        )


def test_per_queue_json_and_pattern() -> None:
    parsed = parse_source_options(
        {**NS, "topicPattern": "Or.*", "startingOffsets": '{"Orders": {"b": {"0": 5, "1": -2}}}'},
        streaming=False,
    )
    assert parsed.starting.spec == {"Orders": {"b": {0: 5, 1: -2}}}
    assert parsed.matches_topic("Orders")
    assert not parsed.matches_topic("Other")
    assert not parsed.matches_topic("RMQ_SYS_TRANS_OP_HALF_TOPIC")


@pytest.mark.parametrize(
    ("text", "ms"), [("15m", 900_000), ("30s", 30_000), ("500ms", 500), ("2", 2), ("1h", 3600_000)]
)
def test_durations(text: str, ms: int) -> None:
    assert parse_duration_ms("maxTriggerDelay", text, 0) == ms


def test_sink_options() -> None:
    parsed = parse_sink_options({**NS, "exactlyOnce": "false", "topic": "Out"})
    assert not parsed.exactly_once
    assert parsed.topic == "Out"
    assert parse_sink_options(NS).exactly_once
    with pytest.raises(ValueError, match="sendBatchSize"):
        parse_sink_options({**NS, "sendBatchSize": "100000"})


def test_sink_id_option_prefixes_the_query_id() -> None:
    from tidemq.spark.exactly_once import sink_id_of

    parsed = parse_sink_options({**NS, "sinkId": "orders"})
    assert parsed.sink_id == "orders"
    assert sink_id_of(parsed, "q-uuid", "job") == "orders:q-uuid"
    assert sink_id_of(parse_sink_options(NS), None, "job") == "job"
    for bad in ("a/b", "a:b"):
        with pytest.raises(ValueError, match="sinkId"):
            parse_sink_options({**NS, "sinkId": bad})
