"""The gates of a reduced precision (numerics, then quality), run for real over twenty seeded
runs: a CNN with BatchNorm under Adam that trains as well in bf16, whose fp32 trainings end
far apart by seed, passes in at least 19; a model bf16 breaks fails in all 20. bf16 autocast
runs on any CPU, slowly: the trainings are small, and every one of them runs in one warm
process. bench/verdicts.py measures the same and the other calibration models."""
from __future__ import annotations

from pathlib import Path

import pytest

from autotune.config import TrialConfig
from autotune.probes import probe_machine
from autotune.trials.runner import TrialRunner
from autotune.verify.gates import gate
from autotune.verify.reference import work_key
from autotune.verify.settings import Settings
from autotune.verify.trainings import Trainings

MODELS = Path(__file__).parent / "models"
RUNS = 20
# Twenty runs of two to six pairs of trainings: about two minutes alone, several times that
# beside the suite's other real processes on 2 cores (past the suite's 300 s per test)
SEEDED_TIMEOUT_S = 900


def gated(model: str, batch_size: int, workdir: Path) -> list[tuple[bool, str | None, int]]:
    """The gates' verdict on bf16 at the model's batch in RUNS runs, each from its own seeds,
    and how many steps the candidate trained. The fp32 references train as a run trains them:
    on the fastest configuration measured alike (``reference.trained_fast``). Here that is the
    baseline's own knobs, as the search finds them for these small models on 2 cores: a
    DataLoader worker only adds its copies. (With the worker a reference trains to the same
    losses and score: tests/test_fast_reference.py.)"""
    machine = probe_machine()
    # tcmalloc: trainings share one warm process (glibc's allocator gets a fresh one each)
    allocator = "tcmalloc" if machine.to_json()["allocators"].get("tcmalloc") else "default"
    baseline = TrialConfig(batch_size=batch_size, allocator=allocator)
    runner = TrialRunner(model_file=MODELS / model, machine=machine, workdir=workdir)
    verdicts = []
    try:
        for run in range(RUNS):
            # a verdict's seeds are the runner's plus 0 to 5: runs apart by more
            runner.seed, runner.workdir = 100 + 10 * run, workdir / f"run{run}"
            fed = baseline.replace(num_workers=1, persistent_workers=True)
            trainings = Trainings(runner, evaluate=True, measured=((baseline, 150.0), (fed, 100.0)))
            cand = baseline.replace(precision="bf16")
            verdict = gate(trainings, baseline, cand, settings=Settings())
            verdicts.append((bool(verdict.passed), verdict.reason, len(trainings.runs[work_key(cand), 0].losses)))
    finally:
        runner.shutdown()
    return verdicts


@pytest.mark.slow
@pytest.mark.timeout(SEEDED_TIMEOUT_S)
def test_bf16_that_trains_as_well_passes_in_19_of_20_seeded_runs_of_its_gates(tmp_path):
    verdicts = gated("noisy_cnn.py", 32, tmp_path)
    assert sum(passed for passed, _, _ in verdicts) >= RUNS - 1, [r for p, r, _ in verdicts if not p]


@pytest.mark.slow
@pytest.mark.timeout(SEEDED_TIMEOUT_S)
def test_bf16_that_breaks_training_fails_its_gates_in_20_of_20_seeded_runs(tmp_path):
    verdicts = gated("bf16_cancels.py", 32, tmp_path)
    assert not any(passed for passed, _, _ in verdicts), verdicts
    assert all("numerics" in (reason or "") for _, reason, _ in verdicts), verdicts
    # rejected within the numerics check's 40 steps: the candidate's training (200 steps
    # of 32, the quality check's) ended where its losses left the fp32 reference's
    assert all(steps <= Settings().numerics_steps for _, _, steps in verdicts), verdicts
