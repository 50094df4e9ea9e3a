"""Shared fixtures for autotune's own tests (the probe tests keep their own conftest)."""
from __future__ import annotations

import os
import subprocess
import sys
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
