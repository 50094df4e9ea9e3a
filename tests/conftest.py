"""Shared fixtures for autotune's own tests (the probe tests keep their own conftest)."""
from __future__ import annotations

from pathlib import Path

import pytest

from helpers import MODELS, machine_doc

# Variables a trial or launch.sh would set: one already set in the environment running the
# tests would be kept (with a warning) and hide whether the knob itself took effect.
TUNED_ENV = ("OMP_NUM_THREADS", "LD_PRELOAD", "MALLOC_CONF", "TUNED_CPUS_PER_RANK",
             "OMP_PROC_BIND", "OMP_PLACES", "KMP_AFFINITY", "KMP_BLOCKTIME")


@pytest.fixture(scope="session")
def models() -> Path:
    return MODELS


@pytest.fixture(scope="session")
def machine() -> dict:
    return machine_doc()


@pytest.fixture(scope="session", autouse=True)
def _no_tuned_env():
    """Trials and generated scripts must see autotune's values, not the test runner's."""
    with pytest.MonkeyPatch.context() as mp:
        for key in TUNED_ENV:
            mp.delenv(key, raising=False)
        yield
