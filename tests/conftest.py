"""Shared fixtures for autotune's own tests (the probe tests keep their own conftest)."""
from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# Under pytest-xdist (README: `pytest -n 2`) each worker's trials take a measurement lock
# of their own: with one lock for the whole machine, a worker's end-to-end run would wait
# for every trial of the other's. Set before anything imports autotune.trials.measure_lock,
# which reads it once; the processes a test starts inherit it, so a test and its children
# (tests/test_measure_lock.py) still see one lock.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER:
    _name = os.environ.get("AUTOTUNE_MEASURE_LOCK")
    os.environ["AUTOTUNE_MEASURE_LOCK"] = f"{_name}-{_WORKER}" if _name else f"tests-{_WORKER}"

# Two workers share the cores, and each starts torch processes whose OpenMP threads, once a
# parallel region ends, spin for their next one: beside the other worker's they spin on the
# cores that worker's processes need. Passive threads sleep instead. A user's own setting is
# kept; autotune tunes no wait policy, so no knob's effect is hidden by it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from helpers import MODELS, machine_doc  # noqa: E402

# The order and grouping of tests under pytest-xdist: hooks, so imported into this namespace.
from xdist_order import pytest_collection_modifyitems, pytest_configure, runs_alone  # noqa: E402, F401

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


@pytest.fixture(scope="module")
def no_autotune_env(tmp_path_factory) -> dict[str, str]:
    """An environment in which `import autotune` fails: PYTHONPATH holds only a poisoned
    autotune package (ahead of the editable install), never the repository."""
    poison = tmp_path_factory.mktemp("poison")
    (poison / "autotune").mkdir()
    (poison / "autotune" / "__init__.py").write_text(
        "raise ImportError('the generated script imported autotune')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(poison)
    probe = subprocess.run([sys.executable, "-c", "import autotune"], env=env,
                           cwd=tmp_path_factory.mktemp("elsewhere"), capture_output=True, text=True)
    assert probe.returncode != 0 and "imported autotune" in probe.stderr
    return env


# --- tests that must run alone ------------------------------------------------------------
#
# xdist has no "run this test alone": every test holds a shared lock on a file of this test
# run for its whole protocol (module fixtures included), and a test marked `alone` holds it
# exclusively, so the other worker waits between tests. The turnstile stops a worker that
# starts test after test from keeping an `alone` test waiting forever (flock favours no one).


def _run_lock(config: pytest.Config, name: str) -> Path:
    # xdist gives each worker a folder in the run's base temporary folder: the lock files
    # lie beside them and go when pytest clears old runs' folders.
    return Path(config.option.basetemp).parent / f"{name}.lock"


@contextlib.contextmanager
def _flock(path: Path, how: int) -> Iterator[None]:
    with open(path, "a") as f:
        fcntl.flock(f, how)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    if not _WORKER:
        yield
        return
    how = fcntl.LOCK_EX if runs_alone(item) else fcntl.LOCK_SH
    with contextlib.ExitStack() as held:
        with _flock(_run_lock(item.config, "turnstile"), fcntl.LOCK_EX):
            held.enter_context(_flock(_run_lock(item.config, "tests"), how))
        yield

