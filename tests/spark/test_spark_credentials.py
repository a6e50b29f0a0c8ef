"""accessKey / secretKey: parsed into Credentials on the driver, carried to the executors in the
pickled options, and never shown: not in the options' repr, not in a parse error, not in the
plans Spark prints for a read or a write."""

from __future__ import annotations

import pickle
from typing import Any

import pytest

from tidemq.client import Credentials
from tidemq.spark.options import parse_credentials, parse_sink_options, parse_source_options

from .conftest import ThreadedCluster, create_topic, send

pytestmark = pytest.mark.spark

SECRET = "spark-secret-value"
KEYS = {"accessKey": "AK-spark", "secretKey": SECRET}


def test_source_and_sink_options_carry_credentials_but_never_show_the_secret() -> None:
    source = parse_source_options(
        {"nameServer": "h:1", "topic": "T", "ACCESSKEY": "AK-spark", "secretkey": SECRET},
        streaming=True,
    )
    sink = parse_sink_options({"nameServer": "h:1", **KEYS})
    for parsed in (source, sink):
        assert parsed.credentials == Credentials("AK-spark", SECRET)
        assert "AK-spark" in repr(parsed)
        assert SECRET not in repr(parsed)
        assert SECRET not in str(parsed)
        # What the executors get (Spark pickles the reader and the writer with their options).
        assert pickle.loads(pickle.dumps(parsed)).credentials == parsed.credentials
    unsigned = parse_source_options({"nameServer": "h:1", "topic": "T"}, streaming=False)
    assert unsigned.credentials is None
    assert parse_credentials({}) is None


@pytest.mark.parametrize(
    ("options", "missing"),
    [({"secretKey": SECRET}, "accessKey"), ({"accessKey": "AK-spark"}, "secretKey")],
)
def test_one_key_alone_is_refused_naming_the_other(options: dict[str, str], missing: str) -> None:
    for parse in (
        lambda: parse_source_options(
            {"nameServer": "h:1", "topic": "T", **options}, streaming=True
        ),
        lambda: parse_sink_options({"nameServer": "h:1", **options}),
    ):
        with pytest.raises(ValueError, match=f"{missing} is missing") as refused:
            parse()
        assert SECRET not in str(refused.value)


def test_plans_of_a_read_and_a_write_do_not_show_the_secret(
    spark: Any, cluster: ThreadedCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    (queue,) = create_topic(cluster.namesrv_addr, "CredentialPlans", 1)
    send(cluster.namesrv_addr, queue, 2)
    reader = spark.read.format("tidemq").option("nameServer", cluster.namesrv_addr)
    frame = reader.option("topic", "CredentialPlans").options(**KEYS).load()
    frame.explain(extended=True)
    assert frame.count() == 2  # signed requests to a broker without ACL: served as usual
    stream = spark.readStream.format("tidemq").option("nameServer", cluster.namesrv_addr)
    stream.option("topic", "CredentialPlans").options(**KEYS).load().explain(extended=True)
    plans = capsys.readouterr().out
    assert "tidemq" in plans.lower()
    assert SECRET not in plans
    # Spark shows a streaming source's options, its own spark.redaction.regex hiding these.
    assert "secretKey=*********(redacted)" in plans
