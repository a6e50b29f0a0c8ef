"""Every non-success response code has exactly one exception class (nats errors.json, in Python)."""

from __future__ import annotations

from tidemq import errors
from tidemq.protocol.codes import ResponseCode


def test_every_code_has_exactly_one_class() -> None:
    seen: set[type[errors.BrokerError]] = set()
    for code in ResponseCode:
        if code is ResponseCode.SUCCESS:
            continue
        cls = errors.error_class_for_code(code)
        assert cls is not errors.BrokerError, code
        assert cls.code is code
        assert cls not in seen
        seen.add(cls)


def test_error_for_code_carries_code_and_remark() -> None:
    error = errors.error_for_code(ResponseCode.TOPIC_NOT_EXIST, "no route for T")
    assert isinstance(error, errors.BrokerError)
    assert error.response_code == 17
    assert "TOPIC_NOT_EXIST" in str(error)
    assert "no route for T" in str(error)
    assert error.retriable


def test_unknown_code_falls_back_to_broker_error() -> None:
    error = errors.error_for_code(9999, "odd")
    assert type(error) is errors.BrokerError
    assert error.response_code == 9999
    assert not error.retriable
