"""What the leader's step profile says to measure next (``autotune.search.steer``): one rule
per category on the space of knob_cnn.py on a recorded H100 (and the CPU's idle rule on a
recorded EPYC), each proposal a configuration of the space derived from the leader; none
already tried, none with a value the space does not offer, none where nothing dominates."""
from __future__ import annotations

import dataclasses

import pytest

from autotune.config import TrialConfig
from autotune.options import RunOptions
from autotune.runtime.shares import Category
from autotune.runtime.step_profile import StepProfile
from autotune.search.steer import THRESHOLDS, Steer, steer
from autotune.search.task_space import build_task_space
from autotune.sections import SearchOptions
from autotune.space import Space
from autotune.space import gpu as gpu_space

from doubles import StandInRunner, recorded_machine
from helpers import knob_cnn


@pytest.fixture(autouse=True)
def _all_gpus_visible(monkeypatch):
    """The recorded machines' GPUs, whatever this machine's CUDA_VISIBLE_DEVICES says."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture(scope="module")
def task():
    return knob_cnn()  # batch_size 16, image inputs, convolutions, AdamW


def space_on(task, machine: str, *, float8: bool = False, **fixed) -> Space:
    """knob_cnn.py's space on a recorded machine; ``float8``: as where torchao imports (it
    is not installed here, and the float8 knob is searched only with it)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gpu_space, "torchao_float8", lambda: None if float8 else "torchao is not installed")
        return build_task_space(task, recorded_machine(machine),
                                SearchOptions.of(RunOptions(fixed=fixed), task=task))


def leader(space: Space, **knobs) -> TrialConfig:
    """A configuration of ``space``: each knob's first value (off, fp32, no workers), the
    user's batch of 16 on the first layout, and ``knobs``."""
    params = {name: values[0] for name, values in space.choices.items()}
    params.update(batch_size=16, **knobs)
    return space.config_from_params(params)


def profile_of(device: str = "cuda", **shares: float) -> StepProfile:
    """A profile with ``shares``, the rest of the step spread evenly over the other
    categories (a few percent each: none dominates)."""
    rest = [c.value for c in Category if c.value not in shares]
    full = {**{c: (1.0 - sum(shares.values())) / len(rest) for c in rest}, **shares}
    return StepProfile(step_ms=5.0, steps=20, device=device, source="gpu kernels" if device == "cuda" else "cpu ops",
                       shares=full)


def changed(best: TrialConfig, cfg: TrialConfig) -> dict:
    """The knobs ``cfg`` sets otherwise than ``best``, as their values."""
    before, after = best.to_dict(), cfg.to_dict()
    return {k: v for k, v in after.items() if before[k] != v}


def changes(steers: list[Steer], best: TrialConfig) -> list[dict]:
    return [changed(best, s.config) for s in steers]


def in_space(space: Space, best: TrialConfig, steers: list[Steer]) -> None:
    for s in steers:
        space.params_of(s.config)  # raises outside the space
        for knob, value in changed(best, s.config).items():
            if knob != "persistent_workers":  # follows num_workers (Space.config_from_params)
                assert value in space.choices[knob], (knob, value)


@pytest.fixture(scope="module")
def h100(task) -> Space:
    return space_on(task, "h100x1")


def test_an_idle_gpu_is_steered_to_cuda_graphs_then_a_larger_batch(h100):
    best = leader(h100)
    steers = steer(profile_of(idle=0.55, matmul=0.2), best, space=h100, tried=[])
    assert changes(steers, best) == [{"compile": "reduce-overhead"}, {"batch_size": 32}]
    assert {s.category for s in steers} == {Category.IDLE} and steers[0].share == 0.55
    assert "CUDA graphs" in steers[0].why and "55%" in steers[0].why
    in_space(h100, best, steers)


def test_an_idle_cpu_step_is_steered_to_a_larger_batch_then_compiled(task):
    epyc = space_on(task, "avx2_epyc")
    best = leader(epyc)
    steers = steer(profile_of("cpu", idle=0.4, matmul=0.25), best, space=epyc, tried=[])
    assert changes(steers, best) == [{"batch_size": 32}, {"compile": "default"}]
    assert all(s.category is Category.IDLE for s in steers)
    in_space(epyc, best, steers)


def test_waiting_for_data_is_steered_to_more_workers_pinned_memory_and_a_deeper_prefetch(h100):
    best = leader(h100)
    assert best.num_workers == 0 and h100.choices["num_workers"][:3] == [0, 1, 2]
    steers = steer(profile_of(data_wait=0.45), best, space=h100, tried=[])
    assert changes(steers, best) == [
        {"num_workers": 1, "persistent_workers": True},
        {"num_workers": 2, "persistent_workers": True},
        {"pin_memory": True},
        {"num_workers": 1, "persistent_workers": True, "prefetch_factor": 4},
    ]
    assert all(s.category is Category.DATA_WAIT for s in steers)
    # a leader with workers: the next counts up, and its workers loading further ahead
    busy = leader(h100, num_workers=4, prefetch_factor=4, pin_memory=True)
    assert changes(steer(profile_of(data_wait=0.45), busy, space=h100, tried=[]), busy) == [
        {"num_workers": 8}, {"num_workers": 16}, {"prefetch_factor": 8}]
    in_space(h100, best, steers)


def test_element_wise_kernels_are_steered_to_compile_then_max_autotune(h100):
    best = leader(h100)
    steers = steer(profile_of(other=0.6, matmul=0.2), best, space=h100, tried=[])
    assert changes(steers, best) == [{"compile": "default"}, {"compile": "max-autotune-no-cudagraphs"}]
    compiled = leader(h100, compile="default")
    assert changes(steer(profile_of(other=0.6), compiled, space=h100, tried=[]), compiled) == [
        {"compile": "max-autotune-no-cudagraphs"}]
    in_space(h100, best, steers)


def test_matrix_products_are_steered_to_bf16_then_float8_with_what_it_needs(task):
    space = space_on(task, "h100x1", float8=True)
    assert space.choices["float8"] == [False, True]
    best = leader(space)
    steers = steer(profile_of(matmul=0.7), best, space=space, tried=[])
    # float8 comes compiled, under bf16: the first compile mode the late stage tries on GPUs
    assert changes(steers, best) == [{"precision": "bf16"},
                                     {"precision": "bf16", "compile": "reduce-overhead", "float8": True}]
    assert all(s.category is Category.MATMUL for s in steers)
    in_space(space, best, steers)
    # without torchao the space offers no float8, and none is proposed
    plain = space_on(task, "h100x1")
    assert "float8" not in plain.choices
    assert changes(steer(profile_of(matmul=0.7), leader(plain), space=plain, tried=[]), leader(plain)) == [
        {"precision": "bf16"}]


def test_matrix_products_take_tf32_where_the_space_offers_no_bf16(h100):
    no_bf16 = dataclasses.replace(h100, choices={**h100.choices, "precision": ["fp32", "fp16", "tf32"]})
    best = leader(no_bf16)
    assert changes(steer(profile_of(matmul=0.7), best, space=no_bf16, tried=[]), best) == [{"precision": "tf32"}]


def test_convolutions_are_steered_to_cudnn_benchmark_channels_last_and_bf16(h100):
    best = leader(h100)
    steers = steer(profile_of(convolution=0.65, other=0.2), best, space=h100, tried=[])
    assert changes(steers, best) == [{"cudnn_benchmark": True}, {"channels_last": True}, {"precision": "bf16"}]
    assert all(s.category is Category.CONVOLUTION for s in steers)
    assert "cuDNN's benchmark" in steers[0].why
    in_space(h100, best, steers)


def test_the_optimizer_step_is_steered_to_the_fused_step(h100):
    assert h100.choices["optimizer_step"] == ["default", "fused"]
    best = leader(h100)
    steers = steer(profile_of(optimizer=0.3), best, space=h100, tried=[])
    assert changes(steers, best) == [{"optimizer_step": "fused"}]
    assert steers[0].category is Category.OPTIMIZER
    fused = leader(h100, optimizer_step="fused")
    assert steer(profile_of(optimizer=0.3), fused, space=h100, tried=[]) == []


def test_attention_is_steered_to_bf16_then_compile(h100):
    best = leader(h100)
    steers = steer(profile_of(attention=0.5, matmul=0.1), best, space=h100, tried=[])
    assert changes(steers, best) == [{"precision": "bf16"}, {"compile": "default"}]
    assert all(s.category is Category.ATTENTION for s in steers) and "flash attention" in steers[0].why


def test_communication_is_steered_to_a_larger_batch_per_rank(task):
    node = space_on(task, "h100x8")
    layouts = [layout for layout in node.choices["layout"] if layout.startswith("8x")]
    assert layouts
    best = leader(node, layout=layouts[0])
    steers = steer(profile_of(communication=0.35, matmul=0.3), best, space=node, tried=[])
    assert changes(steers, best)[0] == {"batch_size": 32}
    assert steers[0].category is Category.COMMUNICATION
    in_space(node, best, steers)


def test_the_dominant_categories_are_followed_largest_first_and_a_repeat_is_proposed_once(h100):
    best = leader(h100)
    steers = steer(profile_of(attention=0.35, convolution=0.45), best, space=h100, tried=[])
    # convolution's bf16 comes first; attention's bf16 is the same configuration, not repeated
    assert changes(steers, best) == [{"cudnn_benchmark": True}, {"channels_last": True}, {"precision": "bf16"},
                                     {"compile": "default"}]
    assert [s.category for s in steers] == [Category.CONVOLUTION] * 3 + [Category.ATTENTION]


def test_nothing_already_tried_is_proposed(h100):
    best = leader(h100)
    profile = profile_of(idle=0.4, convolution=0.45)
    first = steer(profile, best, space=h100, tried=[])
    tried = [s.config for s in first[::2]]
    again = steer(profile, best, space=h100, tried=tried)
    assert [s.config for s in again] == [s.config for s in first[1::2]]
    assert not {s.config for s in again} & set(tried)
    assert steer(profile, best, space=h100, tried=[s.config for s in first]) == []
    assert best not in {s.config for s in first}


def test_a_knob_the_space_does_not_offer_is_never_proposed(task):
    # the EPYC: no GPU (no cuDNN benchmark, pinned memory, CUDA graphs or float8), no bf16 (AVX2 only)
    epyc = space_on(task, "avx2_epyc")
    assert not {"cudnn_benchmark", "pin_memory", "float8"} & set(epyc.choices)
    assert epyc.choices["precision"] == ["fp32"]
    best = leader(epyc)
    everything = profile_of("cpu", convolution=0.3, matmul=0.3, attention=0.3, data_wait=0.1)
    assert changes(steer(everything, best, space=epyc, tried=[]), best) == [
        {"channels_last": True}, {"compile": "default"}]
    # a knob pinned with --fix is not searched: channels_last stays as pinned
    pinned = space_on(task, "h100x1", channels_last=False, precision="fp32")
    best = leader(pinned)
    steers = steer(profile_of(convolution=0.7), best, space=pinned, tried=[])
    assert changes(steers, best) == [{"cudnn_benchmark": True}]
    for category in THRESHOLDS:  # whatever dominates, only the space's values
        for s in steer(profile_of(**{category.value: 0.9}), best, space=pinned, tried=[]):
            assert s.config.channels_last is False and s.config.precision == "fp32"
            pinned.params_of(s.config)


def test_a_step_nothing_dominates_is_not_steered(h100):
    best = leader(h100)
    spread = profile_of(matmul=0.25, convolution=0.25, attention=0.2, data_wait=0.1, optimizer=0.1, idle=0.1)
    assert steer(spread, best, space=h100, tried=[]) == []


def test_a_leader_outside_the_space_is_not_steered(h100):
    outside = leader(h100).replace(batch_size=24)
    assert steer(profile_of(idle=0.9), outside, space=h100, tried=[]) == []


# --- a change that lost is not queued again for the next leader ---------------------------

class CompileLoses(StandInRunner):
    """On this CPU compile runs at 0.7x; everything profiles as element-wise work
    (``other``), with ``other_share(cfg)`` of the step."""

    def __init__(self, doc: dict, other_share) -> None:
        super().__init__(doc, profiles=lambda cfg: profile_of("cpu", other=other_share(cfg)))

    def throughput(self, cfg: TrialConfig) -> float:
        return super().throughput(cfg) * (0.7 / 1.05 if cfg.compile != "off" else 1.0)


def steered_search(task, tmp_path, name: str, other_share):
    from autotune.search import steering
    from autotune.search.budget import SearchBudget
    from autotune.search.course import Course
    from autotune.search.tuner import Tuner, open_study

    space = space_on(task, "avx2_epyc")
    runner = CompileLoses(recorded_machine("avx2_epyc"), other_share)
    study = open_study(storage_path=tmp_path / f"{name}.journal", study_name=name)
    Tuner(study=study, space=space, runner=runner, course=Course(budget=SearchBudget(trials=24))).run()
    rounds = steering.rounds_of(study)
    assert len(rounds) == 2, [r.config for r in rounds]
    return study, rounds


def _categories(r) -> list[str]:
    return [q["category"] for q in r.queued]


def test_a_change_that_lost_for_one_leader_is_not_queued_for_the_next(task, tmp_path):
    """Compile (element-wise work 60% of the step) lost for the first leader: for the next,
    whose profile says the same, it is left out with the reason, and the trials go to layouts
    the search had not measured; the summary says so."""
    from autotune.search import steering

    study, (first, second) = steered_search(task, tmp_path, "lost", lambda cfg: 0.6)
    assert set(_categories(first)) == {"other"}, first.queued  # compile and max-autotune
    assert "other" not in _categories(second), second.queued
    assert len(second.skipped) == len(first.queued), second.skipped
    for skipped in second.skipped:
        assert f"for {first.config} (other 60% of its step, 60% of this one's)" in skipped["why"], skipped
        assert skipped["why"].startswith("compile=") and ("was pruned" in skipped["why"] or "measured 0." in skipped["why"])
    unmeasured = [q for q in second.queued if q["category"] == steering.UNMEASURED]
    assert unmeasured, second.queued
    ran = {c.layout for t in study.trials[:study.trials.index(next(
        t for t in study.trials if (t.user_attrs.get("steer") or {}).get("profiled") == second.config))]
        if (c := steering.config_of(t)) is not None}
    for q in unmeasured:
        layout = TrialConfig.from_dict(study.trials[[t.number for t in study.trials
                                                     if (t.user_attrs.get("steer") or {}).get("why") == q["why"]][0]]
                                       .user_attrs["config"]).layout
        assert layout not in ran or q["why"].startswith("no trial ran batch"), (q, ran)
    lines = steering.found(study).lines()
    assert any(line.startswith("    -> not again: ") and "compile=" in line for line in lines), lines


def test_a_change_that_lost_is_tried_again_where_its_category_grew_by_the_margin(task, tmp_path):
    """The second leader's step is element-wise work 85% against the first's 60%: compile is
    worth a trial again for it."""
    first_leader: list[str] = []

    def share(cfg):
        first_leader.append(cfg.short())
        return 0.6 if cfg.short() == first_leader[0] else 0.6 + steering_margin() + 0.05

    study, (first, second) = steered_search(task, tmp_path, "grew", share)
    assert "other" in _categories(second) and not second.skipped, (second.queued, second.skipped)


def steering_margin() -> float:
    from autotune.search.steering import MARGIN

    return MARGIN
