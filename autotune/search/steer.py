"""What a profile of the leader's step says to measure next: ``steer`` reads where the
best configuration's step goes (a ``StepProfile``, from a profiled trial,
``TrialRunner.run(profile=True)``) and proposes the configurations, derived from it, whose
knobs act on what dominates it: CUDA graphs or a larger batch for a launch-bound step,
more DataLoader workers for one that waits for data, 16-bit precision for matrix
products, convolutions and attention, torch.compile for element-wise work, a fused
optimizer step, a larger batch per rank for communication.

Pure: no trial runs, no file is read. Every proposal is a configuration of the space
(``Space.params_of`` takes it, each changed knob's value is one ``Space.choices`` offers),
built as the search builds its own (``Space.config_from_params``; a late knob as
``Space.late_variants`` sets it, float8 with the bf16 and compile mode it needs), and none
is one already tried.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from autotune.config import KnobValue, Layout, TrialConfig
from autotune.errors import UsageError
from autotune.runtime.knobs import CompileMode, Device, OptimizerStep, Precision
from autotune.runtime.shares import Category
from autotune.runtime.step_profile import StepProfile
from autotune.space import LATE_KNOBS, Space
from autotune.space.gpu import late_params

# The share of the step above which a category dominates it, and its knobs are worth a trial.
# Idle: a GPU that runs no kernel 30% of its step waits on the host's launches (the report's
# own GPU_IDLE, report/profile.py); a CPU step that is 30% Python between ops is as bound by it.
IDLE_SHARE = 0.3
# Waiting for data: past a fifth of the step the DataLoader is the bound (the report's
# DATA_BOUND); below it, more workers take cores from the step for little.
DATA_WAIT_SHARE = 0.2
# The compute categories (matrix products, convolutions, attention, other kernels): the
# knob that speeds one of them by 2x moves the step by a sixth or more only from 30% up,
# about what tells two configurations apart over the noise of a short measurement.
COMPUTE_SHARE = 0.3
# The optimizer's step is a small part of a healthy step (one pass over the weights); at
# 15% its per-tensor loop (a kernel or an op per parameter and state) is what the fused or
# foreach step removes.
OPTIMIZER_SHARE = 0.15
# Communication: a fifth of the step in all-reduce is more than the gradients of a step
# large enough for its ranks should cost; a larger batch per rank amortises it.
COMMUNICATION_SHARE = 0.2

THRESHOLDS: Mapping[Category, float] = {
    Category.IDLE: IDLE_SHARE,
    Category.DATA_WAIT: DATA_WAIT_SHARE,
    Category.MATMUL: COMPUTE_SHARE,
    Category.CONVOLUTION: COMPUTE_SHARE,
    Category.ATTENTION: COMPUTE_SHARE,
    Category.OTHER: COMPUTE_SHARE,
    Category.OPTIMIZER: OPTIMIZER_SHARE,
    Category.COMMUNICATION: COMMUNICATION_SHARE,
}
# DataLoader workers proposed above the leader's, at most: the next values up the space's.
MORE_WORKERS = 2
# torch's own prefetch_factor where it is left unset (None)
DEFAULT_PREFETCH = 2


@dataclasses.dataclass(frozen=True)
class Steer:
    """A configuration to measure next: ``config``, for ``category``, which took ``share``
    of the leader's step; ``why``, in a line."""

    config: TrialConfig
    category: Category
    share: float
    why: str


# A proposal before it is checked against the space: the knobs it changes, and why.
_Change = tuple[dict[str, KnobValue], str]
_Rule = Callable[[TrialConfig, Space, float], list[_Change]]

_WIDE = (Precision.FP32, Precision.TF32)  # precisions a bf16 proposal improves on


def _larger_batch(best: TrialConfig, space: Space) -> dict[str, KnobValue] | None:
    """The next batch size up the space's from the leader's that its ranks and
    micro-batches split evenly; None where there is none (or the batch is pinned)."""
    split = best.nprocs * best.grad_accum
    return next(({"batch_size": b} for b in sorted(space.choices.get("batch_size", []))
                 if b > best.batch_size and b % split == 0), None)


def _bf16(best: TrialConfig, why: str) -> list[_Change]:
    return [({"precision": Precision.BF16.value}, why)] if best.precision in _WIDE else []


def _idle(best: TrialConfig, space: Space, share: float) -> list[_Change]:
    batch = _larger_batch(best, space)
    if best.device == Device.CUDA:
        out: list[_Change] = [({"compile": CompileMode.REDUCE_OVERHEAD.value},
                               f"the GPU runs no kernel {share:.0%} of the step, waiting for the host's launches: "
                               "CUDA graphs (compile=reduce-overhead) launch the step's kernels at once")]
        if batch:
            out.append((batch, f"the GPU idles {share:.0%} of the step between launches: a larger batch gives "
                               "each launch more work"))
        return out
    out = []
    if batch:
        out.append((batch, f"{share:.0%} of the step runs no op (Python between ops): a larger batch gives "
                           "each op more work for the same overhead"))
    if best.compile == CompileMode.OFF:
        out.append(({"compile": CompileMode.DEFAULT.value},
                    f"{share:.0%} of the step runs no op (Python between ops): torch.compile runs the step "
                    "in fewer, fused ops"))
    return out


def _data_wait(best: TrialConfig, space: Space, share: float) -> list[_Change]:
    waits = f"the step waits {share:.0%} of its time for the next batch"
    more = [n for n in sorted(space.choices.get("num_workers", [])) if n > best.num_workers][:MORE_WORKERS]
    out: list[_Change] = [({"num_workers": n}, f"{waits}: {n} DataLoader workers load batches in parallel")
                          for n in more]
    if not best.pin_memory:
        out.append(({"pin_memory": True}, f"{waits}: pinned memory copies each batch to the GPU faster"))
    workers = best.num_workers or (more[0] if more else 0)
    if workers:
        prefetch = best.prefetch_factor or DEFAULT_PREFETCH
        deeper = next((p for p in sorted(v for v in space.choices.get("prefetch_factor", []) if v is not None)
                       if p > prefetch), None)
        if deeper is not None:
            out.append(({"num_workers": workers, "prefetch_factor": deeper},
                        f"{waits}: each of {workers} workers loading {deeper} batches ahead evens out slow ones"))
    return out


def _other(best: TrialConfig, space: Space, share: float) -> list[_Change]:
    what = f"element-wise and other kernels take {share:.0%} of the step"
    out: list[_Change] = []
    if best.compile == CompileMode.OFF:
        out.append(({"compile": CompileMode.DEFAULT.value}, f"{what}: torch.compile fuses them"))
    if best.compile in (CompileMode.OFF, CompileMode.DEFAULT):
        out.append(({"compile": CompileMode.MAX_AUTOTUNE_NO_CUDAGRAPHS.value},
                    f"{what}: torch.compile's max-autotune fuses them and tunes its kernels"))
    return out


def _matmul(best: TrialConfig, space: Space, share: float) -> list[_Change]:
    what = f"matrix products take {share:.0%} of the step"
    out = _bf16(best, f"{what}: bf16 runs them on the tensor cores (or AMX) at twice fp32's rate or more")
    if (best.device == Device.CUDA and best.precision == Precision.FP32
            and Precision.BF16 not in space.choices.get("precision", [])):
        out.append(({"precision": Precision.TF32.value}, f"{what}: TF32 runs them on the tensor cores"))
    if not best.float8:
        out.append(({"float8": True}, f"{what}: float8 matmuls (compiled, under bf16) double bf16's rate"))
    return out


def _convolution(best: TrialConfig, space: Space, share: float) -> list[_Change]:
    what = f"convolutions take {share:.0%} of the step"
    out: list[_Change] = []
    if best.device == Device.CUDA and not best.cudnn_benchmark:
        out.append(({"cudnn_benchmark": True}, f"{what}: cuDNN's benchmark picks the fastest algorithm per shape"))
    if not best.channels_last:
        out.append(({"channels_last": True}, f"{what}: channels_last is the layout their fast kernels take"))
    return out + _bf16(best, f"{what}: bf16 runs them on the tensor cores (or AMX)")


def _optimizer(best: TrialConfig, space: Space, share: float) -> list[_Change]:
    offered = space.choices.get("optimizer_step", [])
    step = next((s for s in (OptimizerStep.FUSED, OptimizerStep.FOREACH) if s in offered), None)
    if step is None or best.optimizer_step in (OptimizerStep.FUSED, step):
        return []
    return [({"optimizer_step": step.value},
             f"the optimizer's step takes {share:.0%} of the step: the {step.value} step updates all "
             "parameters in a few kernels instead of a loop over them")]


def _attention(best: TrialConfig, space: Space, share: float) -> list[_Change]:
    what = f"attention takes {share:.0%} of the step"
    out = _bf16(best, f"{what}: flash attention needs 16-bit inputs (bf16)")
    if best.compile == CompileMode.OFF:
        out.append(({"compile": CompileMode.DEFAULT.value}, f"{what}: torch.compile fuses what surrounds it"))
    return out


def _communication(best: TrialConfig, space: Space, share: float) -> list[_Change]:
    batch = _larger_batch(best, space)
    return [(batch, f"communication takes {share:.0%} of the step: a larger batch per rank sends the same "
                    "gradients once per more samples")] if batch else []


_RULES: Mapping[Category, _Rule] = {
    Category.IDLE: _idle,
    Category.DATA_WAIT: _data_wait,
    Category.OTHER: _other,
    Category.MATMUL: _matmul,
    Category.CONVOLUTION: _convolution,
    Category.OPTIMIZER: _optimizer,
    Category.ATTENTION: _attention,
    Category.COMMUNICATION: _communication,
}


def _offered(value: Any, values: Sequence[Any]) -> bool:
    return any(value == v for v in values)


def _config(space: Space, base: Mapping[str, KnobValue], changes: Mapping[str, KnobValue]) -> TrialConfig | None:
    """``base`` (the leader's params) with ``changes``, as the search would measure it: a
    late knob set as the late stage sets it (float8 with bf16 and a compile mode); None
    where a knob it changes is not searched or the space does not offer the value, or
    the configuration is not one of the space's."""
    params = dict(base)
    for knob, value in changes.items():
        params = late_params(params, knob, value, space.choices) if knob in LATE_KNOBS else {**params, knob: value}
    for knob, value in params.items():
        if (knob not in base or base[knob] != value) and not _offered(value, space.choices.get(knob, [])):
            return None
    try:
        cfg = space.config_from_params(params)
        space.params_of(cfg)
    except (UsageError, ValueError):
        return None
    return cfg


def steer(profile: StepProfile, best: TrialConfig, *, space: Space, tried: Collection[TrialConfig]) -> list[Steer]:
    """The configurations to measure next, in order: for each category that dominates the
    leader's step (its share at least ``THRESHOLDS``'), largest first, what acts on it,
    each derived from ``best``, in ``space``, and in neither ``tried`` nor the list
    already. None where ``best`` is not a configuration of ``space``."""
    try:
        base = space.params_of(best)
    except ValueError:
        return []
    seen = {best, *tried}
    out: list[Steer] = []
    for category, share in profile.ranked():
        if share < THRESHOLDS.get(category, 1.0) or category not in _RULES:
            continue
        for changes, why in _RULES[category](best, space, share):
            cfg = _config(space, base, changes)
            if cfg is None or cfg in seen:
                continue
            seen.add(cfg)
            out.append(Steer(config=cfg, category=category, share=share, why=why))
    return out


def change(space: Space, best: TrialConfig, cfg: TrialConfig) -> dict[str, KnobValue]:
    """The knobs ``cfg`` sets otherwise than ``best``, as the space's params (JSON): what a
    steered trial tried, compared across leaders (``search.steering``)."""
    before, after = space.params_of(best), space.params_of(cfg)
    return {k: v for k, v in after.items() if before.get(k) != v}


def unmeasured(best: TrialConfig, *, space: Space, tried: Collection[TrialConfig]) -> list[tuple[TrialConfig, str]]:
    """What the search has not measured near ``best``, with why: the leader on each layout
    (ranks x threads) no trial ran, nearest in ranks first; then the leader's batch one step
    up and down the space's, where no trial ran it on the leader's layout."""
    try:
        base = space.params_of(best)
    except ValueError:
        return []
    seen = {best, *tried}
    layouts = {c.layout for c in seen}
    out: list[tuple[TrialConfig, str]] = []

    def add(changes: Mapping[str, KnobValue], why: str) -> None:
        cfg = _config(space, base, changes)
        if cfg is not None and cfg not in seen:
            seen.add(cfg)
            out.append((cfg, why))

    offered = [str(v) for v in space.choices.get("layout", [])]
    for layout in sorted(offered, key=lambda v: (abs(Layout.parse(v).nprocs - best.nprocs), v)):
        if layout not in layouts:
            add({"layout": layout}, f"no trial ran {Layout.parse(layout).nprocs} rank(s) x "
                                    f"{Layout.parse(layout).threads or 'default'} thread(s)")
    batches = sorted(space.choices.get("batch_size", []))
    on_layout = {c.batch_size for c in seen if c.layout == best.layout}
    if best.batch_size in batches:
        i = batches.index(best.batch_size)
        for b in (batches[i + 1:i + 2] + batches[max(0, i - 1):i]):
            if b not in on_layout:
                add({"batch_size": b}, f"no trial ran batch {b} on the leader's layout")
    return out
