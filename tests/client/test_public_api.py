"""`tidemq` exports exactly its curated client API (httpx's test_api)."""

from __future__ import annotations

import types

import tidemq


def test_all_is_sorted_importable_and_complete():
    assert sorted(tidemq.__all__, key=str.casefold) == sorted(set(tidemq.__all__), key=str.casefold)
    for name in tidemq.__all__:
        assert getattr(tidemq, name) is not None
    # Subpackages become attributes once imported anywhere; only non-module names are API.
    public = {
        name
        for name, value in vars(tidemq).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public <= set(tidemq.__all__)
    assert tidemq.Producer.__module__ == "tidemq.client.producer"
