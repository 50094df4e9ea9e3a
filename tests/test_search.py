"""The search loop's end game: the best configuration so far is tried at other batch
sizes, then with each late knob (compile) — measured here by a stand-in runner."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from autotune.search.budget import SearchBudget
from autotune.search.course import Course
from autotune.search.study import StudyDamaged, repair_journal
from autotune.search.tuner import Tuner, open_study
from autotune.space import MEMORY_KNOBS, build_space
from autotune.trials.events import WarmupEvent
from autotune.trials.logs import read_event
from autotune.trials.protocol import Role
from autotune.trials.runner import TrialResult

MACHINE = {"cpu": {"usable_cores": 2, "usable_cpus": [0, 1], "isa": {}},
           "backends": {"gloo": True}, "allocators": {}, "gpus": [],
           "compile": {"available": True}}


def throughput(batch_size: int, num_workers: int, nprocs: int = 1) -> float:
    """DataLoader workers help most, larger batches a little; two ranks lose."""
    return 1000.0 + 300 * num_workers + batch_size - 600 * (nprocs - 1)


class ThroughputOfBatch:
    """Measures nothing: ``throughput`` of the configuration."""

    timeout_s = 300.0  # a trial's limit: only compiled ones measured to compile long get more

    def __init__(self) -> None:
        self.measured = []

    def run(self, cfg, *, name, on_window=None, profile=False, **kwargs):
        if profile:  # where the step goes: not known here, and not a measurement
            return TrialResult(status="ok")
        self.measured.append(cfg)
        value = throughput(cfg.batch_size, cfg.num_workers, cfg.nprocs)
        return TrialResult(status="ok", value=value, values=[value] * 3, iqr=0.0,
                           setup=read_event({"e": "setup", "threads": cfg.threads or 2}))


def _but_batch(cfg: dict) -> dict:
    return {k: v for k, v in cfg.items() if k != "batch_size"}


def _value(cfg: dict) -> float:
    return throughput(cfg["batch_size"], cfg["num_workers"], cfg["nprocs"])


def _search(tmp_path: Path, *, trials: int, fixed: dict, one_process: bool = True):
    fixed = {"affinity": "none", "allocator": "default", "interop_threads": None, **fixed}
    if one_process:
        fixed["nprocs"] = 1
    space = build_space(MACHINE, baseline_batch=16, dataset_len=4096, fixed=fixed)
    runner = ThroughputOfBatch()
    study = open_study(storage_path=tmp_path / "study.journal", study_name="sim")
    Tuner(study=study, space=space, runner=runner, course=Course(budget=SearchBudget(trials=trials))).run()
    # duplicates included: a stage's configuration measured earlier costs no trial
    roles = [(t.user_attrs.get("role"), t.user_attrs["config"]) for t in study.trials
             if "config" in t.user_attrs]
    return space, runner, roles


def _best_before(roles: list, i: int, value=None) -> dict:
    """The best configuration measured before the ``i``-th trial of ``roles``."""
    return max((cfg for _, cfg in roles[:i]), key=value or _value)


def test_the_best_climbs_its_batch_and_workers_then_is_compiled(tmp_path):
    """Throughput rises with the batch and with workers: the refinement moves the best of
    its time along those knobs until it holds the largest of each, then the late stage
    tries compile on that best."""
    space, runner, roles = _search(tmp_path, trials=12, fixed={})
    assert len(runner.measured) == 12
    refined = [i for i, (role, _) in enumerate(roles) if role in (Role.BATCH, Role.EDGE)]
    late = [cfg for role, cfg in roles if role == Role.LATE]
    assert refined and len(late) == len(space.choices["compile"]) - 1, roles
    for i in refined:  # each on the best of its time, along one ordered knob
        moved = {k for k, v in roles[i][1].items() if _best_before(roles, i)[k] != v}
        assert moved in ({"batch_size"}, {"num_workers"}), (roles[i], moved)
    best = _best_before(roles, len(roles) - len(late))
    assert best["batch_size"] == max(space.choices["batch_size"]), best
    assert best["num_workers"] == max(space.choices["num_workers"]), best
    # compile comes last, on the best configuration after the refinement
    assert roles[-len(late):] == [(Role.LATE, cfg) for cfg in late]
    assert {c["compile"] for c in late} == set(space.choices["compile"]) - {"off"}
    assert all({**c, "compile": "off"} == best for c in late), late


def test_a_batch_whose_throughput_peaks_far_from_the_samples_is_climbed_to(tmp_path):
    """A range opened wide (--batch-range 4-2048) and a throughput that rises up to batch
    256 and falls beyond: the sampler's best sits well below 256, and one step from it, or
    the range's end, is slower than 256. The refinement climbs there, step after step."""
    fixed = {"affinity": "none", "allocator": "default", "interop_threads": None, "nprocs": 1,
             "threads": 2, "num_workers": 0, "compile": "off", "channels_last": False, "pin_memory": False,
             "optimizer_step": "default"}
    space = build_space(MACHINE, baseline_batch=16, dataset_len=8192, fixed=fixed, batch_range=(4, 2048))
    sampled = [k for k, v in space.choices.items() if len(v) > 1 and k not in MEMORY_KNOBS]
    assert sampled == ["batch_size"], space.choices
    peak = 256

    class PeaksAt256(ThroughputOfBatch):
        def run(self, cfg, *, name, on_window=None, **kwargs):
            self.measured.append(cfg)
            b = cfg.batch_size
            value = 1000.0 * (b / peak if b <= peak else peak / b) ** 0.5
            return TrialResult(status="ok", value=value, values=[value] * 3, iqr=0.0,
                               setup=read_event({"e": "setup", "threads": cfg.threads or 2}))

    study = open_study(storage_path=tmp_path / "study.journal", study_name="sim")
    runner = PeaksAt256()
    # the sampler's part over before it reaches 256: three trials below it, then the
    # refinement's three slots
    for b in (16, 32, 64):
        study.enqueue_trial(space.params_of(space.baseline.replace(batch_size=b, threads=2)))
    Tuner(study=study, space=space, runner=runner, course=Course(budget=SearchBudget(trials=6))).run()
    measured = [c.batch_size for c in runner.measured]
    assert peak in measured, measured


def test_a_pinned_batch_size_goes_straight_to_compile(tmp_path):
    _, runner, roles = _search(tmp_path, trials=8, fixed={"batch_size": 64})
    assert len(runner.measured) == 8
    assert not [r for r, _ in roles if r == Role.BATCH]
    assert [r for r, _ in roles][-2:] == [Role.LATE, Role.LATE]


def test_the_best_of_the_other_process_kind_is_tried_at_larger_batches(tmp_path):
    space, runner, roles = _search(tmp_path, trials=16, fixed={}, one_process=False)
    assert len(runner.measured) == 16
    sizes = sorted(space.choices["batch_size"])
    batch = [cfg for role, cfg in roles if role == Role.BATCH]
    before = [cfg for _, cfg in roles[:roles.index((Role.BATCH, batch[0]))]]
    best = max(before, key=_value)
    assert best["nprocs"] == 1, "the stand-in makes one process the best"
    best_ranks = max((c for c in before if c["nprocs"] > 1), key=_value)
    assert best_ranks["batch_size"] < sizes[-1], "nothing larger to try: the test shows nothing"
    ranks = [c for c in batch if c["nprocs"] > 1]
    # the same knobs as the best several-rank configuration, at larger batches: not smaller ones
    for cfg in ranks:
        assert _but_batch(cfg) == _but_batch(best_ranks)
    assert ranks and all(c["batch_size"] > best_ranks["batch_size"] for c in ranks), ranks
    assert [c for c in batch if c["nprocs"] == 1], "the best itself was not tried at other batches"
    assert [r for r, _ in roles][-len(space.choices["compile"]) + 1:] == \
           [Role.LATE] * (len(space.choices["compile"]) - 1), "compile no longer fits after the stage"


class Bf16Twice(ThroughputOfBatch):
    """bf16 runs twice as fast; workers help either way."""

    def run(self, cfg, *, name, on_window=None, **kwargs):
        result = super().run(cfg, name=name, on_window=on_window, **kwargs)
        if kwargs.get("profile"):
            return result
        if cfg.precision == "bf16":
            result.value *= 2
            result.values = [result.value] * 3
        if on_window is not None:
            for i, v in enumerate(result.values):
                if on_window(i, v):
                    result.status = "pruned"
                    break
        return result


def test_both_precision_kinds_are_measured_early_and_refined_at_the_end(tmp_path):
    machine = {**MACHINE, "cpu": {**MACHINE["cpu"], "isa": {"amx_bf16": True}}}
    fixed = {"affinity": "none", "allocator": "default", "interop_threads": None, "nprocs": 1}
    space = build_space(machine, baseline_batch=16, dataset_len=4096, fixed=fixed)
    assert space.choices["precision"] == ["fp32", "bf16"]
    runner = Bf16Twice()
    study = open_study(storage_path=tmp_path / "study.journal", study_name="sim")
    Tuner(study=study, space=space, runner=runner, course=Course(budget=SearchBudget(trials=14))).run()
    trials = [t for t in study.trials if "config" in t.user_attrs]
    early = [t.user_attrs["config"] for t in trials if t.user_attrs.get("role") == Role.PRECISION]
    assert {c["precision"] for c in early} == {"bf16"} and len({c["batch_size"] for c in early}) == 2
    # fp32 trials are never pruned against the twice-as-fast bf16 ones
    fp32 = [t for t in trials if t.user_attrs["config"]["precision"] == "fp32"
            and t.user_attrs.get("duplicate_of") is None]
    assert fp32 and all(t.state.name == "COMPLETE" for t in fp32), [t.state for t in fp32]
    batch = [t.user_attrs["config"] for t in trials if t.user_attrs.get("role") == Role.BATCH]
    first_batch = next(i for i, t in enumerate(trials) if t.user_attrs.get("role") == Role.BATCH)
    best_before = max((t.user_attrs["config"] for t in trials[:first_batch]
                       if t.state.name == "COMPLETE"),
                      key=lambda c: _value(c) * (2 if c["precision"] == "bf16" else 1))
    assert best_before["precision"] == "bf16"
    # a bf16 winner's knobs in fp32 are tried, and both kinds at other batch sizes
    bf16 = [t.user_attrs["config"] for t in trials if t.user_attrs["config"]["precision"] == "bf16"]
    assert any({**c, "precision": "bf16"} in bf16 for c in batch if c["precision"] == "fp32"), batch
    assert {c["precision"] for c in batch} == {"fp32", "bf16"}
    late = [t.user_attrs["config"] for t in trials if t.user_attrs.get("role") == Role.LATE]
    assert {c["precision"] for c in late} == {"fp32", "bf16"}


# --- the study journal survives a torn write ----------------------------------------

def _study_with_values(path: Path, values: list[float]):
    study = open_study(storage_path=path, study_name="s")
    for v in values:
        t = study.ask()
        t.suggest_int("x", 0, 10)
        study.tell(t, v)
    return study


def _completed(path: Path) -> list[float]:
    from helpers import read_trials

    return [t.value for t in read_trials(path) if t.state.name == "COMPLETE"]


TORN = b'{"op_code":4,"worker_id":"w","trial_id":9,"par'


def test_a_torn_last_write_is_cut_off_and_the_study_goes_on(tmp_path):
    path = tmp_path / "study.journal"
    _study_with_values(path, [1.0, 2.0])
    with open(path, "ab") as f:
        f.write(TORN)
    notice = repair_journal(path)
    assert notice and "torn last write" in notice
    assert (tmp_path / "study.journal.damaged").read_bytes().endswith(TORN)
    assert _completed(path) == [1.0, 2.0]
    _study_with_values(path, [3.0])
    assert _completed(path) == [1.0, 2.0, 3.0]
    assert repair_journal(path) is None, "a sound journal is left alone"


def test_a_write_joined_onto_a_torn_line_is_recovered(tmp_path):
    path = tmp_path / "study.journal"
    _study_with_values(path, [1.0])
    with open(path, "ab") as f:
        f.write(TORN)
    with pytest.raises(ValueError):  # Optuna appends onto the torn line, then cannot read it
        _study_with_values(path, [2.0])
    with pytest.raises(ValueError):
        _completed(path)
    assert "joined" in repair_journal(path)
    assert _completed(path) == [1.0]
    _study_with_values(path, [3.0])
    assert _completed(path) == [1.0, 3.0]


def test_a_line_damaged_beyond_repair_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "study.journal"
    _study_with_values(path, [1.0, 2.0])
    lines = path.read_bytes().split(b"\n")
    lines[1] = b"\x00garbage"
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(StudyDamaged, match=str(path)) as err:
        repair_journal(path)
    assert "mv" in str(err.value) and err.value.exit_code == 2


def test_a_batch_predicted_not_to_fit_in_gpu_memory_is_skipped_unmeasured(tmp_path):
    """Two measured batch sizes of one kind of configuration give a rank's fixed memory and
    its memory per sample; a batch whose predicted peak passes the GPU's memory is skipped."""
    import json

    import optuna

    from autotune.config import TrialConfig

    doc = json.loads((Path(__file__).parent / "fixtures" / "machines" / "h100x1.json").read_text())
    space = build_space(doc, baseline_batch=16)
    study = open_study(storage_path=tmp_path / "s.journal", study_name="s")
    base = TrialConfig(device="cuda", backend="nccl", batch_size=16, precision="bf16")
    total = 81_559.0
    for batch, peak in ((8, 32_000.0), (16, 40_000.0)):  # 24,000 MiB fixed, 1,000 per sample
        study.add_trial(optuna.trial.create_trial(
            value=1.0, params={}, distributions={},
            user_attrs={"config": base.replace(batch_size=batch).to_dict(),
                        "result": {"cuda_peak_mb": peak, "cuda_total_mb": total}}))
    tuner = Tuner(study=study, space=space, runner=ThroughputOfBatch(), course=Course(budget=SearchBudget(trials=1)))
    assert tuner.ledger.memory_bound(base.replace(batch_size=32)) is None  # 56,000 MiB: fits
    assert "MiB per GPU" in tuner.ledger.memory_bound(base.replace(batch_size=64))  # 88,000 MiB
    # another kind of configuration (fp32 activations, other ranks): nothing to predict from
    assert tuner.ledger.memory_bound(base.replace(batch_size=64, precision="fp32")) is None
    assert tuner.ledger.memory_bound(TrialConfig(batch_size=4096)) is None  # CPU: not a GPU's memory


# --- compiled trials on a GPU -----------------------------------------------------------

def _h100x1() -> dict:
    import json

    return json.loads((Path(__file__).parent / "fixtures" / "machines" / "h100x1.json").read_text())


class CompileSlower(Bf16Twice):
    """bf16 twice as fast; every compiled configuration a fifth slower."""

    def run(self, cfg, *, name, on_window=None, **kwargs):
        result = super().run(cfg, name=name, **kwargs)
        if kwargs.get("profile"):
            return result
        if cfg.compile != "off":
            result.value *= 0.8
            result.values = [result.value] * 3
        return result


def test_on_a_gpu_compiling_starts_with_cuda_graphs_and_stops_once_a_mode_is_slower(tmp_path, monkeypatch):
    """On a GPU the late stage compiles reduce-overhead first; shown slower than the
    uncompiled best, the stage's other compiled trials (three more here) are skipped,
    unmeasured, and their slots go to the sampler."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fixed = {"pin_memory": False, "cudnn_benchmark": False, "channels_last": False}
    space = build_space(_h100x1(), baseline_batch=16, dataset_len=4096, fixed=fixed)
    assert len(space.choices["compile"]) == 4 and space.baseline.device == "cuda"
    runner = CompileSlower()
    study = open_study(storage_path=tmp_path / "study.journal", study_name="sim")
    Tuner(study=study, space=space, runner=runner, course=Course(budget=SearchBudget(trials=12))).run()
    compiled = [cfg for cfg in runner.measured if cfg.compile != "off"]
    assert [cfg.compile for cfg in compiled] == ["reduce-overhead"], [c.short() for c in compiled]
    skipped = [t for t in study.trials if t.user_attrs.get("role") == Role.LATE and t.user_attrs.get("skipped")]
    assert len(skipped) == 3 and "reduce-overhead" in skipped[0].user_attrs["skipped"]
    assert len(runner.measured) == 12, "the skipped trials cost no measurement"


def test_compiled_modes_are_all_tried_on_a_gpu_while_compiling_wins(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fixed = {"pin_memory": False, "cudnn_benchmark": False, "channels_last": False}
    space = build_space(_h100x1(), baseline_batch=16, dataset_len=4096, fixed=fixed)
    runner = Bf16Twice()  # compiling costs nothing here
    study = open_study(storage_path=tmp_path / "study.journal", study_name="sim")
    Tuner(study=study, space=space, runner=runner, course=Course(budget=SearchBudget(trials=12))).run()
    late = [t.user_attrs["config"]["compile"] for t in study.trials if t.user_attrs.get("role") == Role.LATE]
    assert late[:3] == ["reduce-overhead", "default", "max-autotune-no-cudagraphs"], late
    assert len(late) == 4 and not [t for t in study.trials if t.user_attrs.get("skipped")]


def test_a_compiled_mode_is_slower_when_pruned_or_under_the_best_by_more_than_noise():
    import optuna

    from autotune.config import TrialConfig
    from autotune.search.late import compile_lost

    base = TrialConfig(device="cuda", backend="nccl", batch_size=16)

    def trial(cfg, value, *, role=None, state=optuna.trial.TrialState.COMPLETE, iqr=0.0):
        return optuna.trial.create_trial(
            state=state, value=value if state == optuna.trial.TrialState.COMPLETE else None,
            params={}, distributions={},
            user_attrs={"config": cfg.to_dict(), "role": role, "result": {"value": value, "iqr": iqr}})

    plain = [trial(base, 1000.0), trial(base.replace(precision="bf16"), 2000.0)]
    compiled = base.replace(compile="reduce-overhead")
    assert compile_lost(plain) is None
    assert compile_lost([*plain, trial(compiled, 960.0, role=Role.LATE)]) is None  # within 5%
    assert "by more than noise" in compile_lost([*plain, trial(compiled, 900.0, role=Role.LATE)])
    assert compile_lost([*plain, trial(compiled, 900.0, role=Role.LATE, iqr=150.0)]) is None  # noisy windows
    assert compile_lost([*plain, trial(compiled, 900.0)]) is None  # not the late stage's
    pruned = trial(compiled, 500.0, role=Role.LATE, state=optuna.trial.TrialState.PRUNED)
    assert "pruned" in compile_lost([*plain, pruned])


class CompileTakes200s(Bf16Twice):
    """Compiling pays off a little, after 200 s of compiling; records each trial's limit."""

    def __init__(self) -> None:
        super().__init__()
        self.limits = []

    def run(self, cfg, *, name, on_window=None, timeout_s=None, **kwargs):
        self.limits.append((cfg, timeout_s))
        result = super().run(cfg, name=name, **kwargs)
        if kwargs.get("profile"):
            return result
        compiled = cfg.compile != "off"
        result.value *= 1.1 if compiled else 1.0
        result.values = [result.value] * 3
        result.setup = dataclasses.replace(result.setup, seconds=1.0)
        result.warmup = WarmupEvent(first_step_s=200.1 if compiled else 0.1, step_s=0.1)
        result.wall_s = result.one_time_s + 10.0
        return result


def test_a_compiled_trials_limit_follows_the_compile_its_mode_was_measured_to_take(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    fixed = {"pin_memory": False, "cudnn_benchmark": False, "channels_last": False}
    space = build_space(_h100x1(), baseline_batch=16, dataset_len=4096, fixed=fixed)
    runner = CompileTakes200s()
    study = open_study(storage_path=tmp_path / "study.journal", study_name="sim")
    Tuner(study=study, space=space, runner=runner, course=Course(budget=SearchBudget(trials=12))).run()
    compiled = [(cfg, limit) for cfg, limit in runner.limits if cfg.compile != "off"]
    assert all(limit is None for cfg, limit in runner.limits if cfg.compile == "off")
    # the first trial of each mode runs under the runner's limit; a later one of a measured
    # mode (reduce-overhead again, on the other precision kind) gets 3 x 201 s + the rest
    first = {cfg.compile: limit for cfg, limit in reversed(compiled)}
    assert set(first.values()) == {None}, compiled
    again = [(cfg, limit) for cfg, limit in compiled if limit is not None]
    assert again and all(cfg.compile == "reduce-overhead" for cfg, _ in again), compiled
    assert again[0][1] == pytest.approx(3 * 201.0 + 10.0)


def test_the_users_configuration_is_measured_when_the_time_ran_out_before_the_first_trial(tmp_path):
    """Under a short --timeout whose search share the probe and the ramp already spent (a
    GPU machine's probe), the search still measures the baseline and nothing else: without
    it the run has nothing to compare with and ends with an error."""
    space = build_space(MACHINE, baseline_batch=16, dataset_len=4096, fixed={})
    runner = ThroughputOfBatch()
    study = open_study(storage_path=tmp_path / "study.journal", study_name="late")
    tuner = Tuner(study=study, space=space, runner=runner,
                  course=Course(budget=SearchBudget(trials=8, timeout_s=10.0, started_at=time.time() - 60)))
    outcome = tuner.run()
    assert runner.measured == [space.baseline]
    assert outcome.baseline is not None and outcome.baseline.config == space.baseline
