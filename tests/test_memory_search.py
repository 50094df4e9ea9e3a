"""Memory as the search knows it (autotune/search/memory.py): a configuration over
--memory-limit is not chosen, one that ran out of memory or over the limit is retried with
the memory knobs before its batch is written off, and the summary says how the winner sits
in memory. On a recorded CPU machine with a stand-in runner that models a rank's peak."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.config import TrialConfig
from autotune.document.memory import BestWithout, MemoryFit
from autotune.errors import UsageError
from autotune.options import RunOptions, parse_size
from autotune.probes.libraries import find_native_libraries
from autotune.search import memory
from autotune.search.trial_summary import TrialSummary
from autotune.space import build_space
from autotune.trials.protocol import Measurement
from autotune.trials.runner import TrialRunner

from doubles import StandInRunner, recorded_machine, tune_stand_in
from helpers import MODELS, knob_cnn, machine_doc

REPO = MODELS.parent.parent
EXAMPLES = REPO / "examples"


class MemoryStandIn(StandInRunner):
    """A rank holds ``fixed_mb`` (weights, gradients, optimizer state; its share under
    sharding) plus ``sample_mb`` per sample of its micro-batch, a quarter of that with
    activation checkpointing. Checkpointing costs a quarter of the speed, accumulation a
    tenth per doubling."""

    def __init__(self, doc, *, fixed_mb=300.0, sample_mb=40.0):
        super().__init__(doc)
        self.fixed_mb, self.sample_mb = fixed_mb, sample_mb

    def peak_mb(self, cfg: TrialConfig) -> float:
        fixed = self.fixed_mb / (cfg.nprocs if cfg.sharding != "off" else 1)
        return fixed + self.sample_mb * cfg.micro_batch * (0.25 if cfg.activation_checkpointing else 1.0)

    def throughput(self, cfg: TrialConfig) -> float:
        value = super().throughput(cfg)
        return value * (0.75 if cfg.activation_checkpointing else 1.0) * 0.9 ** (cfg.grad_accum.bit_length() - 1)

    def measured_done(self, cfg: TrialConfig) -> dict:
        return {"rank_peak_mb": self.peak_mb(cfg)}

    def run_script(self, launcher, *, steps, workdir, timeout_s):
        """The script alone reports its busiest rank's peak too (train_tuned.py --report)."""
        report = super().run_script(launcher, steps=steps, workdir=workdir, timeout_s=timeout_s)
        written = json.loads((Path(launcher).parent / "best_config.json").read_text())
        cfg = TrialConfig.from_dict(written.get("candidate") or written["config"])
        return dataclasses.replace(report, rank_peak_mb=self.peak_mb(cfg))


@pytest.fixture(scope="module")
def task():
    # knob_cnn: batch 16, no BatchNorm; said to have repeated blocks, as a transformer has
    return dataclasses.replace(knob_cnn(), blocks=("Block",))


def test_the_fastest_fit_without_a_memory_knob_is_written_read_back_and_named():
    best = BestWithout(config="batch_size=8", samples_per_s=100.0, chosen_samples_per_s=150.0)
    fit = MemoryFit(limit_mb=600.0, source="--memory-limit", chosen_peak_mb=500.0, baseline_peak_mb=940.0,
                    memory_knobs=("activation_checkpointing",), best_without=best)
    data = json.loads(json.dumps(fit.to_json()))
    assert data["best_without"] == {"config": "batch_size=8", "samples_per_s": 100.0, "chosen_samples_per_s": 150.0}
    assert MemoryFit.from_json(data) == fit
    assert ("the fastest that fit without one, batch_size=8, ran at 100.0 samples/s in the search; "
            "the emitted one at 150.0 (1.50x).") in "\n".join(fit.lines())


def test_the_users_batch_over_the_limit_is_kept_with_the_memory_knobs_and_the_winner_fits(task, tmp_path):
    runner = MemoryStandIn(recorded_machine("avx2_epyc"))
    # batch 16 holds 300 + 40 x 16 = 940 MiB a rank, and over two ranks 620: over 600;
    # checkpointed, 460 on one rank
    doc = tune_stand_in(task, tmp_path, runner, trials=10, fixed={"batch_size": 16}, memory_limit_mb=600.0)
    assert doc["verified"]
    chosen = TrialConfig.from_dict(doc["config"])
    assert chosen.batch_size == 16 and memory.saves_memory(chosen), doc["config"]
    assert runner.peak_mb(chosen) <= 600.0
    fit = doc["memory"]
    assert fit["limit_mb"] == 600.0 and fit["source"] == "--memory-limit"
    # the emitted script's own peak, run alone: what the user will see
    assert fit["alone"] and fit["chosen_peak_mb"] == pytest.approx(runner.peak_mb(chosen))
    # the user's configuration was measured as it is, and the speedup is over it as it fits
    assert fit["baseline_peak_mb"] == pytest.approx(940.0)
    reference = TrialConfig.from_dict(doc["baseline"]["config"])
    assert reference == TrialConfig(batch_size=16, activation_checkpointing=True)
    assert fit["reference"] == reference.short()
    assert "over the --memory-limit" in fit["without"]
    lines = "\n".join(MemoryFit.from_json(fit).lines())
    assert ("your configuration held 940 MiB on a rank, over the --memory-limit (600 MiB a rank): "
            f"the speedup is over it as it fits, {reference.short()}") in lines
    assert "made it fit" in lines
    # every configuration over the limit failed as out of memory, its message says by how much
    over = [f for f in doc["search"]["failures"] if "over the --memory-limit" in f["message"]]
    assert over and all(f["failure"] == "out_of_memory" for f in over)
    # every trial of the budget measured something: a sampled configuration at a batch that
    # ran out of memory is measured holding less, not skipped (the memory knobs are not sampled);
    # the user's configuration holding less (the reference) costs none of it
    assert len(runner.measured) == 10 + 1
    # the end of the search refines the best configuration (compile on it) holding what it holds
    late = [c for c in runner.measured if c.compile != "off"]
    assert late and all(memory.saves_memory(c) for c in late), late
    # nothing over the limit was ranked
    ranked = [TrialConfig.from_dict(c["config"]) for c in doc["candidates"]]
    assert all(runner.peak_mb(c) <= 600.0 for c in ranked)


def test_where_memory_does_not_bind_no_memory_knob_is_measured(task, tmp_path):
    runner = MemoryStandIn(recorded_machine("avx2_epyc"), fixed_mb=100.0, sample_mb=1.0)
    doc = tune_stand_in(task, tmp_path, runner, trials=8)
    assert not [c for c in runner.measured if memory.saves_memory(c)]
    assert doc["memory"]["memory_knobs"] == [] and doc["memory"]["limit_mb"] > 1000


def space_for(task, name="avx2_epyc", **kw):
    return build_space(recorded_machine(name), baseline_batch=task.batch_size, blocks=task.blocks, **kw)


def test_the_rescue_recomputes_first_then_shards_then_accumulates(task):
    space = space_for(task)
    cfg = TrialConfig(nprocs=2, threads=1, batch_size=16)
    steps = []
    while cfg is not None:
        steps.append(memory.knobs_on(cfg))
        cfg = memory.rescue(cfg, space)
    assert steps == [(), ("activation_checkpointing",), ("activation_checkpointing", "sharding=full"),
                     ("activation_checkpointing", "grad_accum=2", "sharding=full"),
                     ("activation_checkpointing", "grad_accum=4", "sharding=full"),
                     ("activation_checkpointing", "grad_accum=8", "sharding=full")]  # micro-batch 1


def test_a_batch_above_the_users_is_not_rescued_and_a_pin_is_kept(task):
    space = space_for(task)
    assert memory.rescue(TrialConfig(batch_size=32), space) is None
    pinned = space_for(task, fixed={"activation_checkpointing": False})
    assert memory.rescue(TrialConfig(batch_size=16), pinned) == TrialConfig(batch_size=16, grad_accum=2)


def test_the_users_own_configuration_is_widened_over_the_ranks_once_one_rank_holds_nothing_less(task):
    space = space_for(task, fixed={"activation_checkpointing": False, "grad_accum": 1})
    assert memory.rescue(TrialConfig(batch_size=16), space) is None
    widened = memory.rescue(TrialConfig(batch_size=16), space, widen=True)
    assert widened.nprocs == 2 and widened.sharding == "full" and widened.batch_size == 16


def test_the_memory_knobs_are_not_sampled_and_do_not_count_in_the_grid(task):
    space = space_for(task)
    assert space.choices["grad_accum"][0] == 1 and space.choices["sharding"][0] == "off"
    plain = space_for(task, fixed={"activation_checkpointing": False, "grad_accum": 1, "sharding": "off"})
    assert space.grid_size == plain.grid_size


def test_a_model_without_repeated_blocks_or_with_batchnorm_has_no_such_knob(task):
    space = build_space(recorded_machine("avx2_epyc"), baseline_batch=16, batchnorm_layers=("bn",))
    assert "activation_checkpointing" not in space.choices and "grad_accum" not in space.choices
    assert "repeated blocks" in space.excluded["activation_checkpointing"]
    assert "BatchNorm" in space.excluded["grad_accum"]


@pytest.mark.parametrize("text", ["6", "six GiB", "0GiB", "-1G"])
def test_a_memory_limit_without_a_unit_or_positive_size_is_refused(text):
    with pytest.raises(UsageError, match="--memory-limit .*: expected a size with its unit"):
        parse_size(text)


def test_memory_limit_sizes_read_in_binary_units():
    assert parse_size("6GiB") == parse_size("6G") == 6144.0
    assert parse_size("800MiB") == parse_size("800m") == 800.0
    with pytest.raises(UsageError, match="--memory-limit"):
        RunOptions(memory_limit_mb=0.0)


def test_without_a_limit_a_cpu_rank_may_hold_its_share_of_the_machine_and_a_gpu_rank_its_device():
    limit = memory.MemoryLimit(user_mb=None, host_mb=8000.0)
    assert limit.per_rank_mb(TrialConfig(nprocs=2, batch_size=16)) == 4000.0
    assert limit.per_rank_mb(TrialConfig(device="cuda", backend="nccl")) is None
    assert limit.over(TrialConfig(nprocs=2, batch_size=16), TrialSummary(rank_peak_mb=4100.0))
    assert limit.over(TrialConfig(nprocs=2, batch_size=16), TrialSummary(rank_peak_mb=3900.0)) is None


def test_a_processs_host_peak_starts_afresh_for_each_configuration():
    """A warm process measures several configurations: each one's peak is its own."""
    from autotune.trials.peak_memory import host_peak_mb, reset_host_peak

    big = bytearray(200 * 2**20)
    big[:: 4096] = b"x" * len(big[:: 4096])  # touched: resident
    held = host_peak_mb()
    del big
    reset_host_peak()
    assert host_peak_mb() < held - 150


TCMALLOC = find_native_libraries()[0]["tcmalloc"]


@pytest.mark.slow
@pytest.mark.skipif(TCMALLOC is None, reason="tcmalloc is not installed (CI installs it: see .ci/run)")
def test_a_real_trial_reports_less_held_with_checkpointing_and_with_accumulation(tmp_path):
    """What the rescue relies on, in real trial processes: a rank's peak as the trial
    reports it falls when activations are recomputed or the micro-batch is smaller. Under
    tcmalloc, which returns what a step freed to itself: glibc's malloc keeps freed memory
    resident in its arenas, and there a peak can rise when less is held at once."""
    runner = TrialRunner(model_file=EXAMPLES / "long_sequences.py",
                         machine={**machine_doc(), "allocators": {"tcmalloc": TCMALLOC}},
                         workdir=tmp_path, measurement=Measurement(warmup_steps=2, window_s=0.3, windows=1),
                         warm=False)
    base = TrialConfig(batch_size=16, allocator="tcmalloc")
    peaks = {}
    for name, cfg in (("plain", base), ("checkpointed", base.replace(activation_checkpointing=True)),
                      ("accumulated", base.replace(grad_accum=4))):
        result = runner.run(cfg, name=name)
        assert result.status == "ok", result.log_tail
        peaks[name] = result.summary()["rank_peak_mb"]
    assert peaks["checkpointed"] < peaks["plain"] - 50, peaks
    assert peaks["accumulated"] < peaks["plain"] - 50, peaks


RELEASE = """
from autotune.runtime.session import return_freed_memory
def rss(): return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
blocks = [bytearray(1 << 20) for _ in range(300)]
for b in blocks: b[::4096] = b"x" * len(b[::4096])
del blocks, b
freed = rss(); return_freed_memory()
print(freed, rss())
"""


@pytest.mark.slow
@pytest.mark.skipif(TCMALLOC is None, reason="tcmalloc is not installed (CI installs it: see .ci/run)")
def test_what_a_configuration_freed_leaves_a_warm_process_under_tcmalloc():
    """tcmalloc keeps what the program freed, and a warm process's next configuration would
    start its measured peak from there: between configurations it goes back to the system."""
    library = TCMALLOC
    proc = subprocess.run([sys.executable, "-c", RELEASE], capture_output=True, text=True, check=True,
                          env={**os.environ, "LD_PRELOAD": library, "PYTHONPATH": str(REPO)})
    freed, released = map(float, proc.stdout.split())
    assert released < freed - 200, (freed, released)


def test_what_ran_out_of_memory_bounds_only_what_holds_no_less():
    """bf16 at batch 16 ran out: fp32 at 16 (larger activations) and bf16 at 32 will too;
    fp32's failure says nothing of bf16, nor glibc's of tcmalloc, nor one without
    checkpointing of one with it."""
    bf16 = TrialConfig(batch_size=16, precision="bf16")
    assert memory.oom_bound([bf16], TrialConfig(batch_size=16)) == 16
    assert memory.oom_bound([bf16], bf16.replace(batch_size=32)) == 16
    assert memory.oom_bound([TrialConfig(batch_size=16)], bf16) is None
    assert memory.oom_bound([bf16], bf16.replace(allocator="tcmalloc")) is None
    assert memory.oom_bound([bf16], bf16.replace(activation_checkpointing=True)) is None


def test_a_knob_worth_nothing_stays_where_the_winner_without_it_is_not_known_to_fit():
    """The allocator measured as idle is dropped, unless without it the configuration is not
    known to fit: under glibc the same configuration peaks higher."""
    from autotune.verify import ablation

    winner = TrialConfig(batch_size=16, allocator="tcmalloc", activation_checkpointing=True)
    variant = next(v for v in ablation.variants(winner, TrialConfig(batch_size=16)) if v.knob == "allocator")
    idle = {"ratios": [1 / r for r in (1.01, 0.97, 1.03, 0.99, 1.0, 1.02)]}
    dropped = ablation._knob_effect(variant, idle, winner, TrialConfig(batch_size=16), fits=True)
    kept = ablation._knob_effect(variant, idle, winner, TrialConfig(batch_size=16), fits=False)
    assert not dropped.kept and kept.kept and "not known to fit in memory" in kept.note


def test_where_memory_bound_only_what_was_measured_within_the_limit_is_known_to_fit():
    limit = memory.MemoryLimit(user_mb=500.0)
    fits = TrialConfig(batch_size=16, allocator="tcmalloc", activation_checkpointing=True)
    over = TrialConfig(batch_size=16)
    measured = [(fits, TrialSummary(rank_peak_mb=440.0)), (over, TrialSummary(rank_peak_mb=640.0))]
    known = memory.known_to_fit(limit, measured=measured, failed=[(over, "out_of_memory", "")])
    assert known(fits) and known(fits.replace(threads=1, num_workers=2))  # holds as much
    assert not known(over) and not known(fits.replace(allocator="default"))
    unbound = memory.known_to_fit(limit, measured=measured[:1], failed=[])
    assert unbound(over)  # nothing ran out or over: memory never bound


def test_the_users_configuration_holding_less_is_found_first_and_costs_no_trial(task, tmp_path):
    """The user's batch 16 holds 940 MiB a rank, over a 350 MiB limit: checkpointed 460,
    then with 2 micro-batches 380, with 4 340. Each step is measured at once after the
    user's configuration, before any start or sampled trial, and none counts against
    --trials: the search still gets all of them."""
    class CompileHelps(MemoryStandIn):
        """Compiling is worth a quarter: a winner clear enough for a re-run to stay above 1x."""

        def throughput(self, cfg: TrialConfig) -> float:
            return super().throughput(cfg) * (1.25 if cfg.compile != "off" else 1.0)

    runner = CompileHelps(recorded_machine("avx2_epyc"))
    doc = tune_stand_in(task, tmp_path, runner, trials=6, fixed={"batch_size": 16}, memory_limit_mb=350.0)
    assert {c.layout for c in runner.measured[:4]} == {runner.measured[0].layout}
    assert [memory.knobs_on(c) for c in runner.measured[:4]] == [
        (), ("activation_checkpointing",), ("activation_checkpointing", "grad_accum=2"),
        ("activation_checkpointing", "grad_accum=4")], runner.measured[:4]
    assert [runner.peak_mb(c) <= 350.0 for c in runner.measured[:4]] == [False, False, False, True]
    assert TrialConfig.from_dict(doc["baseline"]["config"]) == runner.measured[3]  # the reference
    # the user's configuration is trial 1 of the 6, as where it fits; its steps holding less cost none
    assert len(runner.measured) == 6 + 3 and doc["search"]["measured"] == 6 + 3
    assert doc["verified"]


def test_the_users_configuration_holding_less_ends_with_every_knob_on_over_the_most_ranks(task):
    """Widened over the ranks, it keeps its micro-batches: one rank's step before it held
    micro-batches of 1, and two ranks over the whole batch would hold 8 each."""
    space = space_for(task)
    steps = [TrialConfig(batch_size=16)]
    while (held := memory.rescue(steps[-1], space, widen=True)) is not None:
        steps.append(held)
    assert [memory.knobs_on(c) for c in steps[:2]] == [(), ("activation_checkpointing",)]
    assert steps[-2].nprocs == 1 and steps[-2].micro_batch == 1
    least = steps[-1]
    assert least.nprocs == max(layout.nprocs for layout in space.layouts) and least.sharding == "full"
    assert least.activation_checkpointing and least.micro_batch == 1 and least.batch_size == 16


def test_where_nothing_fits_the_error_names_the_least_held_and_what_would_fit(task, tmp_path):
    """Weights and optimizer state alone hold 300 MiB, 150 on each of two ranks sharded: under
    a 150 MiB limit nothing fits. The whole ladder is walked (the search's trials are not
    spent on it), and the error names the least it held, and the limit that would hold it."""
    from autotune.errors import NotVerified

    runner = MemoryStandIn(recorded_machine("avx2_epyc"))
    with pytest.raises(NotVerified) as caught:
        tune_stand_in(task, tmp_path, runner, trials=4, fixed={"batch_size": 16}, memory_limit_mb=150.0)
    message = str(caught.value)
    # one rank: recomputed, then 2 to 16 micro-batches; last, every knob on over two ranks
    assert [memory.knobs_on(c) for c in runner.measured[:7]] == [
        (), ("activation_checkpointing",), *[("activation_checkpointing", f"grad_accum={n}") for n in (2, 4, 8, 16)],
        ("activation_checkpointing", "grad_accum=8", "sharding=full")], runner.measured[:7]
    least = runner.measured[6]
    assert least.nprocs == 2 and least.micro_batch == 1 and runner.peak_mb(least) == pytest.approx(160.0)
    assert len(runner.measured) == 7 + 3  # and the search's own 3 trials after the user's
    assert (f"the least it held was 160 MiB a rank, as {least.short()}, over the --memory-limit (150 MiB a rank). "
            "It would need a --memory-limit of at least 160 MiB a rank") in message, message


def test_what_the_user_held_least_says_the_limit_and_the_batch_that_would_fit():
    """A rank's peak falls no faster than its batch: 16 x 400 / 460 bounds the batch that fits."""
    limit = memory.MemoryLimit(user_mb=400.0)
    plain, held = TrialConfig(batch_size=16), TrialConfig(batch_size=16, activation_checkpointing=True)
    text = memory.nothing_fits(limit, [(plain, TrialSummary(rank_peak_mb=940.0)),
                                       (held, TrialSummary(rank_peak_mb=460.0))])
    assert f"the least it held was 460 MiB a rank, as {held.short()}, over the --memory-limit" in text, text
    assert "a --memory-limit of at least 460 MiB a rank, or a batch size of at most 13" in text, text
    # stopped on the host before its end: it held at least its tree's peak
    stopped = memory.nothing_fits(memory.MemoryLimit(host_mb=1000.0), [(plain, TrialSummary(peak_rss_mb=1200.0))])
    assert "1,200 MiB a rank when it was stopped" in stopped and "more than 1,200 MiB of this machine" in stopped
    assert memory.nothing_fits(limit, [(plain, TrialSummary())]) is None


# warnings.catch_warnings, which open_study silences the sampler's with, is not thread-safe
@pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")
def test_workers_sharing_a_study_take_each_step_of_the_reference_once(task, tmp_path):
    """Two workers of one study (threads here, each with its own storage handle, one lock):
    whichever worker takes a step, no step is measured twice, each comes after the one
    before it ran out, the steps cost none of the study's budget, and both find the reference."""
    import threading
    import time

    from autotune.search.budget import SearchBudget
    from autotune.search.course import Course
    from autotune.search.scoring import Scoring
    from autotune.search.tuner import Tuner, open_study
    from autotune.search.turns import Turns

    class Slow(MemoryStandIn):  # the workers' trials overlap
        def run(self, cfg, **kw):
            time.sleep(0.05)
            return super().run(cfg, **kw)

    space = space_for(task, fixed={"batch_size": 16})
    lock, outcomes, runners = threading.RLock(), {}, {}

    def worker(name):
        runners[name] = runner = Slow(recorded_machine("avx2_epyc"))
        study = open_study(storage_path=tmp_path / "study.journal", study_name="shared")
        tuner = Tuner(study=study, space=space, runner=runner, course=Course(
            budget=SearchBudget(trials=6), turns=Turns(shared=True, lock=lambda: lock),
            scoring=Scoring(memory_limit=memory.MemoryLimit(user_mb=350.0))))
        tuner.POLL_S = 0.01
        outcomes[name] = tuner.run()

    threads = [threading.Thread(target=worker, args=(name,)) for name in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert set(outcomes) == {"a", "b"}
    held = space.baseline.replace(activation_checkpointing=True)
    steps = [space.baseline, held, held.replace(grad_accum=2), held.replace(grad_accum=4)]  # 340 MiB fits
    measured = runners["a"].measured + runners["b"].measured
    # where the other worker's trial ran out holding as much, a step is skipped unmeasured
    taken = [measured.count(c) for c in steps]
    assert max(taken) == 1 and taken[-1] == 1, (taken, measured)
    assert all(outcome.baseline is not None and outcome.baseline.config == steps[3] for outcome in outcomes.values())
    # the search had all the study's 6 trials, the user's configuration one of them (two workers
    # may both start the last one: each looks at the budget, then asks for a trial)
    assert len(measured) - sum(taken[1:]) in (6, 7), (taken, measured)
