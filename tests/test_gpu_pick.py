"""On a GPU the pick fills the GPU: the search starts from what an expert runs, at the
batch the ramp found fastest; the leader's step profile steers the next trials; a compile
is priced against what is left of the whole run, its estimate from the first compile
measured."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import optuna
import pytest

from autotune.config import TrialConfig
from autotune.options import RunOptions
from autotune.runtime.knobs import Device
from autotune.runtime.shares import Category
from autotune.runtime.step_profile import StepProfile
from autotune.search import late, steering
from autotune.search.budget import SearchBudget
from autotune.search.course import Course, Starts
from autotune.search.starts import gpu_start
from autotune.search.task_space import build_task_space
from autotune.search.tuner import Tuner, open_study
from autotune.sections import SearchOptions
from autotune.space import Space, build_space
from autotune.trials.protocol import Role, StudyAttr
from autotune.trials.runner import TrialResult

from doubles import StandInRunner, recorded_machine
from helpers import knob_cnn


@pytest.fixture(autouse=True)
def _all_gpus_visible(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture(scope="module")
def task():
    return knob_cnn()  # batch 16, convolutions, AdamW, evaluate()


def space_of(task, name: str = "h100x1") -> Space:
    return build_task_space(task, recorded_machine(name), SearchOptions.of(RunOptions(), task=task))


def test_the_gpu_start_is_what_an_expert_runs(task):
    """bf16, DataLoader workers up to a GPU's share of the host's cores (less the rank's
    own), pinned and persistent, cuDNN's benchmark for a model with convolutions, the fused
    AdamW step; its fp32 twin beside it."""
    space = space_of(task)  # one H100, 32 host cores
    assert max(space.choices["num_workers"]) == 32, space.choices["num_workers"]
    start, twin = gpu_start(space, recorded_machine("h100x1"))
    assert start.precision == "bf16" and twin.precision == "fp32"
    assert start.num_workers == 16 and start.pin_memory and start.persistent_workers
    assert start.cudnn_benchmark and start.optimizer_step == "fused"
    assert twin == start.replace(precision="fp32")
    # eight GPUs share the 32 cores: four workers a rank, of which the start takes two
    eight = space_of(task, "h100x8")
    assert max(eight.choices["num_workers"]) == 4
    assert gpu_start(eight, recorded_machine("h100x8"))[0].num_workers == 2


def test_a_model_without_convolutions_is_not_offered_cudnns_benchmark(task):
    space = space_of(dataclasses.replace(task, convolutions=False))
    assert "cudnn_benchmark" not in space.choices
    assert "no convolution layers" in space.excluded["cudnn_benchmark"]
    start, _ = gpu_start(space, recorded_machine("h100x1"))
    assert not start.cudnn_benchmark


def test_the_model_files_check_says_whether_it_has_convolutions(task):
    from autotune.task import load_task

    assert task.convolutions
    assert not load_task(Path(__file__).parent.parent / "examples" / "tiny_gpt.py").convolutions


def _queued(space: Space, *, heuristics, fastest: int | None, tmp_path: Path) -> list[tuple[str, TrialConfig]]:
    """What the start queues: (role, configuration), in order."""
    from autotune.search.ledger import Ledger
    from autotune.search.queued import Stages

    study = open_study(storage_path=tmp_path / "study.journal", study_name="starts")
    Stages(Ledger(study, space), trials=20, heuristics=heuristics, fastest_batch=fastest).enqueue_start()
    return [(t.user_attrs[StudyAttr.ROLE], space.config_from_params(t.system_attrs["fixed_params"]))
            for t in study.trials]


def test_on_a_gpu_the_start_moves_to_the_ramps_fastest_batch_and_the_users_batch_is_not_retried(task, tmp_path):
    """The ramp found batch 128 fastest (the user's is 16): the expert's start and its twin
    run there, each reduced precision once, there; the user's batch only as the baseline."""
    space = space_of(task)
    starts = gpu_start(space, recorded_machine("h100x1"))
    queued = _queued(space, heuristics=starts, fastest=128, tmp_path=tmp_path)
    roles = [r for r, _ in queued]
    assert roles[0] == Role.BASELINE and queued[0][1].batch_size == 16
    rest = [cfg for _, cfg in queued[1:]]
    assert {cfg.batch_size for cfg in rest} == {128}, [c.short() for c in rest]
    assert len(rest) == len(set(rest)) == 4  # bf16 (the start), fp32 (its twin), fp16, tf32
    assert {cfg.precision for cfg in rest} == {"bf16", "fp32", "fp16", "tf32"}


def test_on_a_cpu_each_precision_is_still_tried_at_two_batches(tmp_path):
    from autotune.probes import as_machine
    from autotune.search.starts import heuristics

    amx = as_machine(recorded_machine("amx_spr"))
    space = build_space(amx, baseline_batch=16, dataset_len=4096)
    queued = _queued(space, heuristics=heuristics(space, amx), fastest=64, tmp_path=tmp_path)
    bf16 = {cfg.batch_size for role, cfg in queued if role == Role.PRECISION and cfg.precision == "bf16"}
    assert bf16 == {16, 64}


# --- compiles priced against the whole run ----------------------------------------------

class CompileWins(StandInRunner):
    """A compiled configuration runs 1.5x; nothing here takes time."""

    def throughput(self, cfg: TrialConfig) -> float:
        return super().throughput(cfg) * (1.5 if cfg.compile != "off" else 1.0)


def _tune_with_room(tmp_path: Path, *, room_s: float) -> tuple[optuna.Study, CompileWins]:
    fixed = {"pin_memory": False, "cudnn_benchmark": False, "channels_last": False, "num_workers": 0}
    space = build_space(recorded_machine("h100x1"), baseline_batch=16, dataset_len=4096, fixed=fixed)
    runner = CompileWins(recorded_machine("h100x1"))
    study = open_study(storage_path=tmp_path / f"room{room_s:g}.journal", study_name="room")
    # 20 s of the search's share: less than a cold compile (40 s), but the run has room_s left
    budget = SearchBudget(trials=10, timeout_s=20.0, room_s=lambda outcome, once_s: room_s)
    Tuner(study=study, space=space, runner=runner, course=Course(budget=budget)).run()
    return study, runner


def test_on_a_gpu_a_compile_is_priced_against_the_whole_run_not_the_searchs_share(tmp_path):
    study, runner = _tune_with_room(tmp_path, room_s=200.0)
    assert any(cfg.compile != "off" for cfg in runner.measured), [c.short() for c in runner.measured]
    study, runner = _tune_with_room(tmp_path, room_s=25.0)  # below the quickest mode's cold compile (30 s)
    assert not any(cfg.compile != "off" for cfg in runner.measured)
    skipped = [t.user_attrs[StudyAttr.SKIPPED] for t in study.trials if t.user_attrs.get(StudyAttr.SKIPPED)]
    assert skipped and "past what --timeout leaves before verification (25 s left)" in skipped[0], skipped


def _search_at_the_knee(task, tmp_path: Path, *, room_s: float | None, trials: int = 8) -> list[tuple[str, TrialConfig]]:
    """A search on one H100 whose ramp found batch 128 fastest, with --timeout's room as
    given (None: no --timeout); the trials measured, (role, configuration), in order."""
    space = space_of(task)
    study = open_study(storage_path=tmp_path / f"knee{room_s}.journal", study_name="knee")
    budget = (SearchBudget(trials=trials) if room_s is None else
              SearchBudget(trials=trials, timeout_s=300.0, room_s=lambda outcome, once_s: room_s))
    starts = Starts(heuristics=gpu_start(space, recorded_machine("h100x1")), fastest_batch=128)
    runner = CompileWins(recorded_machine("h100x1"))
    Tuner(study=study, space=space, runner=runner, course=Course(budget=budget, starts=starts)).run()
    role = {TrialConfig.from_dict(t.user_attrs[StudyAttr.CONFIG]): t.user_attrs.get(StudyAttr.ROLE)
            for t in study.trials if StudyAttr.CONFIG in t.user_attrs and not t.user_attrs.get(StudyAttr.DUPLICATE_OF)}
    return [(role[cfg], cfg) for cfg in runner.measured]


def test_under_a_timeout_the_leader_at_the_knee_is_compiled_ahead_of_the_queued_starts(task, tmp_path):
    """Under --timeout on a GPU, once the user's configuration and the start at the ramp's
    knee are measured, the next trial compiles the leader, in the default mode (its batch
    fills the GPU: CUDA graphs save next to nothing there), ahead of the precisions queued
    behind it: queued by the trials left it would come after them, by when a short --timeout
    no longer holds it. Where the run does not hold its compile, or without --timeout, the
    queue goes on in its order."""
    ran = _search_at_the_knee(task, tmp_path, room_s=200.0)
    roles = [role for role, _ in ran]
    assert roles[:3] == [Role.BASELINE, Role.HEURISTIC, Role.LATE], [(r, c.short()) for r, c in ran]
    leader, compiled = ran[1][1], ran[2][1]
    assert leader.batch_size == 128 and compiled == leader.replace(compile="default"), compiled.short()
    starts_end = max(i for i, role in enumerate(roles) if role == Role.PRECISION)  # the starts still run, after it
    assert [i for i, (_, c) in enumerate(ran[:starts_end]) if c.compile != "off"] == [2]  # one compile ahead

    for room_s in (25.0, None):  # below a cold compile of the default mode (30 s); no --timeout
        ran = _search_at_the_knee(task, tmp_path, room_s=room_s)
        first = next((i for i, (_, c) in enumerate(ran) if c.compile != "off"), len(ran))
        assert all(role != Role.LATE for role, _ in ran[:first]) and first > 3, [(r, c.short()) for r, c in ran]
        assert Role.PRECISION in [role for role, _ in ran[:first]]


def test_a_batch_that_fills_the_gpu_compiles_in_the_default_mode_first():
    variants = [{"compile": m} for m in ("reduce-overhead", "default", "max-autotune-no-cudagraphs")]
    assert [p["compile"] for p in late.ordered(variants, Device.CUDA)][:2] == ["reduce-overhead", "default"]
    assert [p["compile"] for p in late.ordered(variants, Device.CUDA, filled=True)] == [
        "default", "max-autotune-no-cudagraphs", "reduce-overhead"]
    assert late.ordered(variants, Device.CPU, filled=True) == variants  # on a CPU as the space gives them


def _compiled_trial(compile_mode: str, once_s: float) -> optuna.trial.FrozenTrial:
    cfg = TrialConfig(batch_size=16, device="cuda", backend="nccl", compile=compile_mode)
    return optuna.trial.create_trial(value=1.0, user_attrs={StudyAttr.CONFIG: cfg.to_dict(),
                                                            StudyAttr.RESULT: {"one_time_s": once_s, "wall_s": 30}})


def test_the_compile_estimate_comes_from_the_first_compile_measured():
    cfg = TrialConfig(batch_size=16, device="cuda", backend="nccl", compile="default")
    assert late.compile_estimate_s([], cfg) == late.COLD_DEFAULT_S  # the quickest mode to compile
    assert late.compile_estimate_s([], cfg.replace(compile="reduce-overhead")) == late.COLD_COMPILE_S
    measured = [_compiled_trial("reduce-overhead", 12.0)]
    assert late.compile_estimate_s(measured, cfg) == 12.0
    autotuned = cfg.replace(compile="max-autotune-no-cudagraphs")
    assert late.compile_estimate_s(measured, autotuned) == 12.0 * late.AUTOTUNE_FACTOR
    assert late.compile_estimate_s([*measured, _compiled_trial("default", 20.0)], cfg) == 20.0


# --- the search steered by where the step goes ------------------------------------------

def idle_profile(cfg: TrialConfig) -> StepProfile:
    """A launch-bound step: the GPU idle 80% of it."""
    shares = {c.value: 0.0 for c in Category}
    shares.update(idle=0.8, matmul=0.1, other=0.1)
    return StepProfile(step_ms=4.0, steps=50, device="cuda", source="gpu kernels", shares=shares)


class Profiled(CompileWins):
    def __init__(self, doc: dict) -> None:
        super().__init__(doc, profiles=idle_profile)


def test_the_leader_is_profiled_after_the_start_and_its_profile_queues_the_next_trials(task, tmp_path):
    """The start measured, the leader runs once profiled (no trial of the budget); its idle
    step queues CUDA graphs (compile=reduce-overhead) and a larger batch, measured next; the
    study records which profile led to which trial, and what each found."""
    space = space_of(task)
    runner = Profiled(recorded_machine("h100x1"))
    study = open_study(storage_path=tmp_path / "study.journal", study_name="steer")
    starts = gpu_start(space, recorded_machine("h100x1"))
    course = Course(budget=SearchBudget(trials=10), starts=Starts(heuristics=starts))
    Tuner(study=study, space=space, runner=runner, course=course).run()
    assert runner.profiled, "the leader was profiled"
    first = runner.profiled[0]
    trials = study.get_trials(deepcopy=False)
    roles = [t.user_attrs.get(StudyAttr.ROLE) for t in trials]
    steered = [t for t in trials if t.user_attrs.get(StudyAttr.ROLE) == Role.STEERED]
    start_roles = (Role.BASELINE, Role.HEURISTIC, Role.PRECISION)
    assert steered and roles.index(Role.STEERED) == sum(r in start_roles for r in roles)  # right after the start
    configs = [TrialConfig.from_dict(t.user_attrs[StudyAttr.CONFIG]) for t in steered[:2]]
    assert configs[0] == first.replace(compile="reduce-overhead"), configs[0].short()
    assert configs[1].batch_size > first.batch_size and configs[1].compile == "off"
    assert all(t.user_attrs[StudyAttr.STEER]["category"] == "idle" for t in steered[:2])
    # a profiled run is not a measurement: it costs no trial
    assert len(runner.measured) == 10
    found = steering.found(study)
    assert found is not None and found.rounds[0].config == first.short()
    lines = found.lines()
    assert lines[0].startswith("where the leader's step went")
    assert "idle 80%" in lines[1] and "x the leader" in lines[2], lines


def test_a_profile_queues_no_more_trials_than_the_budget_has_left(task, tmp_path):
    """The start leaves one trial of the budget: the leader's idle step would queue two or
    more, and only one is queued and measured. A trial queued past the budget would wait in
    the study after the search ended, and a resumed run would find it unfinished."""
    space = space_of(task)
    starts = gpu_start(space, recorded_machine("h100x1"))

    def search(name: str, trials: int) -> tuple[Profiled, optuna.Study]:
        runner = Profiled(recorded_machine("h100x1"))
        study = open_study(storage_path=tmp_path / f"{name}.journal", study_name=name)
        course = Course(budget=SearchBudget(trials=trials), starts=Starts(heuristics=starts))
        Tuner(study=study, space=space, runner=runner, course=course).run()
        return runner, study

    start = len(search("start", 1)[1].get_trials(deepcopy=False))  # the whole start is queued first
    runner, study = search("room", start + 1)
    trials = study.get_trials(deepcopy=False)
    assert runner.profiled and len(runner.measured) == start + 1
    assert [t.user_attrs.get(StudyAttr.ROLE) for t in trials].count(Role.STEERED) == 1
    left = [(t.number, t.state.name) for t in trials if not t.state.is_finished()]
    assert not left, f"trials left unfinished after the search: {left}"


def test_without_a_profile_nothing_is_steered_and_the_search_goes_on(task, tmp_path):
    space = space_of(task)
    runner = CompileWins(recorded_machine("h100x1"))  # its profiled runs report nothing
    study = open_study(storage_path=tmp_path / "study.journal", study_name="none")
    Tuner(study=study, space=space, runner=runner, course=Course(budget=SearchBudget(trials=8))).run()
    assert len(runner.profiled) == 1 and len(runner.measured) == 8
    assert not [t for t in study.trials if t.user_attrs.get(StudyAttr.ROLE) == Role.STEERED]
    found = steering.found(study)
    assert found is not None and "no profile" in found.lines()[1]


def test_the_steering_is_in_best_config_json_and_the_summary(task, tmp_path):
    from autotune import pipeline
    from autotune.report.console import Reporter

    from helpers import written_document

    runner = Profiled(recorded_machine("h100x1"))
    out = tmp_path / "out"
    out.mkdir()
    pipeline.execute(task, out, pipeline.RunOptions(trials=10), machine=runner.doc, runner=runner,
                     reporter=Reporter(quiet=True))
    doc = written_document(out)
    rounds = doc["steering"]["rounds"]
    assert rounds and rounds[0]["profile"]["shares"]["idle"] == pytest.approx(0.8)
    assert any("CUDA graphs" in t["why"] or "reduce-overhead" in t["why"] for t in rounds[0]["trials"]), rounds
    assert "where the leader's step went" in (out / "report.md").read_text()
    json.dumps(doc)  # a JSON document, as written
    assert isinstance(TrialResult(status="ok").step_profile, type(None))


@pytest.mark.slow
def test_the_runs_processes_share_torch_compiles_cache_in_the_output_folder(tmp_path, monkeypatch):
    """A trial's process (and so a script run's, started the same way) reads and writes
    torch.compile's cache in the run's folder: what one process compiled, the next reads.
    A user's own TORCHINDUCTOR_CACHE_DIR is kept."""
    from autotune.harness import COMPILE_CACHE
    from autotune.trials.protocol import Measurement
    from autotune.trials.runner import TrialRunner, compile_cache_env

    from helpers import MODELS

    record = tmp_path / "seen.txt"
    model = tmp_path / "records_cache.py"
    model.write_text(f"import os, pathlib\npathlib.Path({str(record)!r}).write_text("
                     "os.environ.get('TORCHINDUCTOR_CACHE_DIR', ''))\n" + (MODELS / "tiny_cnn.py").read_text())
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    cache = tmp_path / "out" / COMPILE_CACHE
    runner = TrialRunner(model_file=model, machine=recorded_machine("avx2_epyc"), workdir=tmp_path / "trials",
                         measurement=Measurement(window_s=0.2, windows=1), compile_cache=cache)
    try:
        assert runner.run(TrialConfig(batch_size=16), name="t").status == "ok"
    finally:
        runner.shutdown()
    assert record.read_text() == str(cache)
    assert compile_cache_env({"TORCHINDUCTOR_CACHE_DIR": "/mine"}, folder=cache) == {}
