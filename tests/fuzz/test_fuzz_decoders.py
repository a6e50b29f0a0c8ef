"""The fuzz targets (tidemq.testing.fuzz.targets) for a bounded number of examples each.

Each target draws a valid structure from the product's encoder, mutates it (or leaves it
intact for the round trip) and checks the decoder's contract; `make fuzz` runs the same targets
for minutes. Example counts are sized so this folder runs in well under a minute on 2 cores.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from tidemq.testing.fuzz import targets

_fuzz = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_fuzz
@given(targets.frame_cases())
def test_frame_decoder(case: targets.Case) -> None:
    targets.check_frames(case)


@_fuzz
@given(targets.json_header_cases())
def test_json_header_with_weird_values(case: targets.Case) -> None:
    targets.check_json_header(case)


@_fuzz
@given(targets.typed_header_cases)
def test_typed_headers(fields: dict[str, str]) -> None:
    targets.check_typed_headers(fields)


@_fuzz
@given(targets.properties_cases())
def test_properties_parser(case: targets.Case) -> None:
    targets.check_properties(case)


@_fuzz
@given(targets.batch_cases())
def test_batch_body_decoder(case: targets.Case) -> None:
    targets.check_batch(case)


@_fuzz
@given(targets.record_cases())
def test_store_record_decoder(case: targets.Case) -> None:
    targets.check_record(case)


@_fuzz
@given(targets.sql_cases())
def test_sql92_parser(case: targets.Case) -> None:
    targets.check_sql(case)


@_fuzz
@given(targets.ha_cases())
def test_ha_handshake_sessions(case: targets.Case) -> None:
    targets.check_ha(case)


def test_every_target_is_tested_here() -> None:
    tested = {"frames", "json_header", "typed_headers", "properties", "batch", "record", "sql92"}
    tested.add("ha_handshake")
    assert set(targets.TARGETS) == tested
