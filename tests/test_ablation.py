"""Why the winner won: each knob reverted to the baseline's value, measured side by side
with the winner; knobs worth nothing measurable are dropped from what is emitted."""
from __future__ import annotations

import math

import pytest

from autotune.config import TrialConfig
from autotune.document.ablation import Ablation
from autotune.document.run import RunDocument
from autotune.options import parse_fixes
from autotune.verify import ablation

from doubles import StandInRunner, recorded_machine, tune_stand_in
from helpers import knob_cnn

BASELINE = TrialConfig(batch_size=32)


def test_one_variant_per_knob_that_differs_with_companion_knobs_reverted_together():
    winner = TrialConfig(nprocs=2, threads=1, batch_size=256, num_workers=1, persistent_workers=True,
                         channels_last=True, allocator="tcmalloc")
    found = {v.knob: v.config for v in ablation.variants(winner, BASELINE)}
    assert set(found) == {"layout", "batch_size", "num_workers", "channels_last", "allocator"}
    assert found["layout"] == winner.replace(nprocs=1, threads=None)
    assert found["num_workers"] == winner.replace(num_workers=0, persistent_workers=False)
    assert found["allocator"] == winner.replace(allocator="default")


def test_a_revert_that_makes_no_valid_configuration_is_left_out():
    winner = TrialConfig(nprocs=2, threads=1, batch_size=64)
    odd = TrialConfig(batch_size=33)
    assert [v.knob for v in ablation.variants(winner, odd)] == ["layout"]


def test_no_variant_runs_as_the_winner_and_one_that_runs_as_the_baseline_is_the_baseline():
    """A revert of knobs that do nothing on the winner's device (pinned memory on CPU, core
    pinning on GPUs) would measure the winner against itself; a variant that runs as the
    baseline is held as the baseline, once."""
    cpu = TrialConfig(batch_size=64, pin_memory=True, channels_last=True)
    assert [v.knob for v in ablation.variants(cpu, BASELINE)] == ["batch_size", "channels_last"]
    gpu_base = TrialConfig(batch_size=32, device="cuda", backend="nccl")
    gpu = gpu_base.replace(precision="bf16", affinity="compact")
    found = ablation.variants(gpu, gpu_base)
    assert [(v.knob, v.config) for v in found] == [("precision", gpu_base)]
    assert ablation.session_configs(gpu, gpu_base, path=True) == [gpu_base]


def test_rounds_stay_within_the_speed_checks_windows():
    assert ablation.rounds_for(4, speed_windows=50) == 10
    assert ablation.rounds_for(9, speed_windows=50) == 5
    assert ablation.rounds_for(20, speed_windows=50) == ablation.MIN_ROUNDS


def test_simplified_drops_only_the_knobs_worth_nothing():
    winner = TrialConfig(nprocs=2, threads=1, batch_size=256, channels_last=True, allocator="tcmalloc")
    doc = {"knobs": [{"knob": k, "baseline": None, "winner": None, "kept": kept, "note": ""}
                     for k, kept in (("layout", True), ("channels_last", False), ("allocator", False))]}
    assert ablation.simplified(winner, BASELINE, Ablation.from_json(doc)) == winner.replace(channels_last=False,
                                                                         allocator="default")


class Knobs(StandInRunner):
    """Batch size and workers pay, as the stand-in's model says; the allocator, pinning,
    channels_last and interop threads are worth nothing here."""


@pytest.fixture(scope="module")
def task():
    return knob_cnn()


def test_the_run_reports_each_knobs_worth_and_emits_the_winner_without_the_idle_ones(task, tmp_path):
    doc = tune_stand_in(task, tmp_path, Knobs(recorded_machine("avx2_epyc")), path=True)
    assert doc["verified"]
    found = doc["ablation"]
    baseline = TrialConfig.from_dict(doc["baseline"]["config"])
    knobs = {k["knob"]: k for k in found["knobs"]}
    assert knobs, "the winner differs from the baseline in some knob"
    emitted = TrialConfig.from_dict(doc["config"])
    for name, knob in knobs.items():
        fields = ablation.KNOB_GROUPS[name]
        if knob["kept"]:
            assert knob["ci_low"] > 1.0 or knob["ratio"] >= ablation.NEGLIGIBLE
            assert any(getattr(emitted, f) != getattr(baseline, f) for f in fields), name
        else:
            assert all(getattr(emitted, f) == getattr(baseline, f) for f in fields), name
    idle = {"allocator", "affinity", "channels_last", "interop_threads"} & set(knobs)
    assert idle and all(not knobs[k]["kept"] for k in idle), knobs
    if found.get("simplified"):
        assert found["simplified"]["dropped"] == [k for k, v in knobs.items() if not v["kept"]]
    # The kept knobs' ratios multiply to the winner's speedup when the knobs do not interact
    # (the stand-in's speed is a product of per-knob factors).
    assert found["product"] == pytest.approx(doc["speedup"]["median"], rel=0.05)
    # The path's steps multiply to the whole, each step the factor of the knobs it adds.
    steps = found["path"]["steps"]
    assert [k for s in steps for k in s["knobs"]] == [k for k in ablation.KNOB_GROUPS if k in knobs]
    assert math.prod(s["ratio"] for s in steps) == pytest.approx(found["path"]["total"])
    assert found["path"]["kept_product"] == pytest.approx(doc["speedup"]["median"], rel=0.05)
    assert all(s["kept"] == any(knobs[k]["kept"] for k in s["knobs"]) for s in steps)


class Complementary(Knobs):
    """bf16 pays only at a large batch (and needs AMX to pay): neither alone is worth
    what the two are together, as on real hardware."""

    def throughput(self, cfg: TrialConfig) -> float:
        value = 1000.0 * (1.5 if cfg.batch_size >= 128 else 1.0)
        if cfg.precision == "bf16":
            value *= 2.0 if cfg.batch_size >= 128 else 0.9
        return value * (1.1 if cfg.num_workers else 1.0)


def test_when_knobs_complement_each_other_the_path_still_multiplies_to_the_verified_speedup(
        task, tmp_path):
    doc = tune_stand_in(task, tmp_path, Complementary(recorded_machine("amx_spr")), trials=16, path=True,
                fixed=parse_fixes(["layout=1x2", "compile=off", "allocator=default"]))
    found = doc["ablation"]
    knobs = {k["knob"]: k for k in found["knobs"]}
    assert {"batch_size", "precision"} <= set(knobs), knobs
    # leave-one-out: each removal costs more than its share
    assert found["product"] > doc["speedup"]["ci_high"]
    path = found["path"]
    assert doc["speedup"]["ci_low"] <= path["kept_product"] <= doc["speedup"]["ci_high"]
    by_knob = {s["knobs"][0]: s["ratio"] for s in path["steps"]}
    assert by_knob["batch_size"] == pytest.approx(1.5, rel=0.02)  # batch first, as ordered
    assert by_knob["precision"] == pytest.approx(2.0, rel=0.02)
    from autotune.report.advice import ablation_lines

    lines = [line.strip() for line in ablation_lines(RunDocument.from_json(doc))]
    assert any("steps multiply to" in line and line.endswith(": inside") for line in lines), lines
    assert any("the knobs complement each other" in line for line in lines), lines


def test_the_path_adds_one_knob_group_at_a_time_and_ends_at_the_winner():
    winner = TrialConfig(nprocs=2, threads=1, batch_size=256, num_workers=1, persistent_workers=True,
                         precision="bf16", allocator="tcmalloc")
    steps = ablation.steps_from(winner, BASELINE)
    assert [s.knobs for s in steps] == [("layout",), ("batch_size",), ("num_workers",), ("precision",),
                                        ("allocator",)]
    assert steps[0].config == BASELINE.replace(nprocs=2, threads=1)
    assert steps[2].config == BASELINE.replace(nprocs=2, threads=1, batch_size=256, num_workers=1,
                                               persistent_workers=True)
    assert steps[-1].config == winner
    # the intermediate configurations, the baseline and the leave-one-out variants, once each
    held = ablation.session_configs(winner, BASELINE, path=True)
    assert len(held) == len(set(held)) and winner not in held and BASELINE in held
    assert len(held) == 5 + 1 + 4 - 1  # the last intermediate is the allocator's variant


def test_without_path_the_ablation_holds_only_the_leave_one_out_variants(task, tmp_path):
    winner = TrialConfig(nprocs=2, threads=1, batch_size=256, num_workers=1, persistent_workers=True,
                         precision="bf16", allocator="tcmalloc")
    held = ablation.session_configs(winner, BASELINE)
    assert held == [v.config for v in ablation.variants(winner, BASELINE)] and BASELINE not in held
    # the whole run: each knob's worth is reported and decides what is emitted; no path
    runner = Knobs(recorded_machine("avx2_epyc"))
    doc = tune_stand_in(task, tmp_path, runner)
    assert doc["verified"] and doc["ablation"]["knobs"] and "path" not in doc["ablation"]


def test_a_step_that_makes_no_valid_configuration_goes_with_the_next_knob():
    odd = TrialConfig(batch_size=33)  # two ranks cannot split it
    winner = TrialConfig(nprocs=2, threads=1, batch_size=64, allocator="tcmalloc")
    steps = ablation.steps_from(winner, odd)
    assert [s.knobs for s in steps] == [("layout", "batch_size"), ("allocator",)]
    assert steps[-1].config == winner



def test_a_knob_the_user_pinned_is_neither_measured_nor_dropped():
    winner = TrialConfig(nprocs=2, threads=1, batch_size=64, allocator="tcmalloc")
    assert [v.knob for v in ablation.variants(winner, BASELINE, pinned={"nprocs", "threads"})] == [
        "batch_size", "allocator"]


def test_a_knob_likely_worth_something_is_kept_though_noise_hides_it():
    winner = TrialConfig(nprocs=1, threads=2, batch_size=256, channels_last=True, allocator="tcmalloc")

    def effect(knob, ratios):
        variant = next(v for v in ablation.variants(winner, BASELINE) if v.knob == knob)
        return ablation._knob_effect(variant, {"ratios": ratios}, winner, BASELINE).to_json()

    noisy = effect("batch_size", [1 / r for r in (1.14, 0.96, 1.26, 1.2, 1.1, 1.15)])
    assert noisy["ci_low"] <= 1.0 and noisy["kept"] and "likely worth keeping" in noisy["note"]
    idle = effect("channels_last", [1 / r for r in (1.01, 0.97, 1.03, 0.99, 1.0, 1.02)])
    assert not idle["kept"] and "removed" in idle["note"]
    helps = effect("allocator", [1 / r for r in (1.2, 1.22, 1.19, 1.25, 1.21, 1.2)])
    assert helps["kept"] and helps["ci_low"] > 1.0 and helps["note"] == ""


def test_when_the_simplified_configuration_fails_alone_the_full_winner_says_its_knobs_were_kept(
        task, tmp_path):
    """Alone, the simplified configuration (idle knobs dropped) runs slower than the
    baseline: the full winner is emitted, and its report must not claim knobs were removed."""

    class SimplerFailsAlone(Knobs):
        def run_script(self, launcher, *, steps, workdir, timeout_s):
            report = super().run_script(launcher, steps=steps, workdir=workdir, timeout_s=timeout_s)
            if "candidate-0" in str(launcher):  # the first run alone: the simplified one
                report.samples_per_s = 1.0
            return report

    doc = tune_stand_in(task, tmp_path, SimplerFailsAlone(recorded_machine("avx2_epyc")))
    assert doc["verified"]
    found = doc["ablation"]
    assert found["simplified"]["rejected"]
    emitted = TrialConfig.from_dict(doc["config"])
    assert emitted == TrialConfig.from_dict(next(
        c["config"] for c in doc["candidates"] if c["config_short"] == found["simplified"]["from"]))
    for knob in found["knobs"]:
        if not knob["kept"]:
            assert "but kept" in knob["note"]
    from autotune.report.advice import ablation_lines

    assert not any("removed from the emitted" in line for line in ablation_lines(RunDocument.from_json(doc)))
