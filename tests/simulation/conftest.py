"""Seeds for the simulations: a fixed set per run, or one seed to replay.

pytest tests/simulation --seed=N        (this directory's option)
TIDEMQ_SIM_SEED=N pytest tests/         (works from anywhere)
"""

from __future__ import annotations

import os

import pytest

# The seeds every run covers; a failure names its seed so it can be replayed alone.
DEFAULT_SEEDS = (1, 2, 3, 4, 5, 6)
SEED_ENV = "TIDEMQ_SIM_SEED"


def pytest_configure(config: pytest.Config) -> None:
    # Registered here: the marker belongs to this directory (pyproject.toml is the lead's).
    config.addinivalue_line("markers", "simulation: seeded simulation with injected faults")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--seed", type=int, default=None, help="replay one simulation seed")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "seed" not in metafunc.fixturenames:
        return
    chosen = metafunc.config.getoption("--seed", default=None)
    if chosen is None and os.environ.get(SEED_ENV):
        chosen = int(os.environ[SEED_ENV])
    seeds = (chosen,) if chosen is not None else DEFAULT_SEEDS
    metafunc.parametrize("seed", seeds, ids=[f"seed={s}" for s in seeds])
