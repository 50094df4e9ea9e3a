"""The gates' fp32 references train on the fastest configuration the search measured that
computes what they compute (``verify.reference.trained_fast``): its DataLoader workers,
pinning and prefetch, threads and cuDNN's benchmark, never its precision, compile, batch or
ranks; and what they train to is what the baseline's knobs train to."""
from __future__ import annotations

from pathlib import Path

import pytest

from autotune.config import TrialConfig
from autotune.probes import probe_machine
from autotune.trials.runner import TrialRunner
from autotune.verify.deadline import UNMEASURED_SLOWER, Costs
from autotune.verify.gates import gate
from autotune.verify.reference import fastest_alike, trained_fast
from autotune.verify.settings import Settings
from autotune.verify.trainings import Trainings

from doubles import NamedStandIn, recorded_machine

MODELS = Path(__file__).parent / "models"
USER = TrialConfig(batch_size=64, device="cuda", backend="nccl")


def test_a_reference_takes_the_feeding_knobs_of_the_fastest_alike_and_nothing_else():
    workers = USER.replace(num_workers=8, pin_memory=True, persistent_workers=True, prefetch_factor=4,
                           cudnn_benchmark=True, channels_last=True, optimizer_step="fused")
    measured = (
        (USER, 1000.0),
        (workers, 3000.0),  # computes the same to rounding: its feeding knobs are taken
        (USER.replace(num_workers=16, precision="bf16"), 9000.0),  # reduced precision: not alike
        (USER.replace(num_workers=16, compile="default"), 8000.0),  # compiled: not alike
        (USER.replace(num_workers=16, batch_size=128), 7000.0),  # another batch: not alike
    )
    ref = trained_fast(USER, measured)
    assert ref == USER.replace(num_workers=8, pin_memory=True, persistent_workers=True, prefetch_factor=4,
                               cudnn_benchmark=True)
    assert not ref.channels_last and ref.optimizer_step == USER.optimizer_step  # what the reference computes stays
    assert fastest_alike(USER, measured) == (workers, 3000.0)
    # none alike measured (fp32 at 4096): the reference as it was
    assert trained_fast(USER.replace(batch_size=4096), measured) == USER.replace(batch_size=4096)


def test_a_gates_training_is_priced_at_the_rate_of_what_it_trains_on():
    fast = USER.replace(num_workers=8, pin_memory=True, persistent_workers=True)
    bf16 = USER.replace(batch_size=4096, precision="bf16", num_workers=8)
    costs = Costs(start_s=10.0, window_s=1.0, sample_s=1 / 1000.0, rates=((USER, 1000.0), (fast, 3000.0),
                                                                         (bf16, 80_000.0)))
    assert costs.rate_of(fast) == 3000.0
    assert costs.rate_of(trained_fast(USER, costs.rates)) == 3000.0
    # fp32 at a batch measured only in bf16: a share of that batch's fastest, never below the baseline's
    assert costs.rate_of(USER.replace(batch_size=4096)) == pytest.approx(80_000.0 / UNMEASURED_SLOWER)
    assert costs.rate_of(USER.replace(batch_size=2048)) is None
    assert costs.process(samples=30_000, rate=costs.rate_of(fast)) == pytest.approx(10.0 + 10.0)
    assert costs.process(samples=30_000) == pytest.approx(10.0 + 30.0)  # at the baseline's rate


def test_the_gates_train_their_references_on_the_fastest_alike():
    """A bf16 candidate at a larger batch: its numerics and quality references (fp32 at its
    batch) and the batch check's run of the user's configuration each train on the feeding
    knobs of the fastest alike the search measured."""
    runner = NamedStandIn(recorded_machine("h100x1"))
    user = TrialConfig(batch_size=16, device="cuda", backend="nccl")
    cand = user.replace(batch_size=64, precision="bf16", num_workers=4, persistent_workers=True, pin_memory=True)
    measured = ((user, 100.0), (user.replace(num_workers=2, persistent_workers=True), 150.0),
                (cand.replace(precision="fp32", num_workers=4), 300.0), (cand, 500.0))
    trainings = Trainings(runner, evaluate=True, measured=measured)
    verdict = gate(trainings, user, cand, settings=Settings())
    assert "numerics" in verdict.checks and "batch" in verdict.checks, verdict.checks
    references = [cfg for name, cfg in runner.names if "reference" in name]
    assert references and all(cfg.precision == "fp32" for cfg in references)
    assert {(c.batch_size, c.num_workers) for c in references} == {(64, 4), (16, 2)}, runner.names


def _trained(runner: TrialRunner, cfg: TrialConfig, measured: tuple) -> tuple[list[float], float | None]:
    trainings = Trainings(runner, evaluate=True, measured=measured)
    result = trainings.of(trainings.reference(cfg), "reference", scored=True)
    return result.losses, result.metric


@pytest.mark.slow
def test_a_reference_on_the_faster_knobs_trains_to_what_the_baselines_knobs_train_to(tmp_path):
    """The same seed's fp32 training, once on the baseline's knobs and once on a DataLoader
    worker's (the fastest alike measured): the same losses and evaluate() score, to fp32's
    rounding (the batches are the same, in the same order)."""
    machine = probe_machine()
    baseline = TrialConfig(batch_size=16)
    runner = TrialRunner(model_file=MODELS / "bf16_noisy.py", machine=machine, workdir=tmp_path)
    try:
        plain, plain_score = _trained(runner, baseline, ())
        fed = baseline.replace(num_workers=1, persistent_workers=True)
        fast, fast_score = _trained(runner, baseline, ((baseline, 100.0), (fed, 150.0)))
    finally:
        runner.shutdown()
    assert plain and len(fast) == len(plain)
    assert fast == pytest.approx(plain, rel=1e-5, abs=1e-6)
    assert plain_score is not None and fast_score == pytest.approx(plain_score, rel=1e-5, abs=1e-6)
