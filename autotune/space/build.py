"""The search space: which knobs exist on this machine, and why the others do not.

Built from the machine probe (``autotune.probes.Machine``) and the model file
(``Task``). Each knob has a small builder (``autotune.space.choices``) that returns its
candidate values and a reason for every value it leaves out; ``build_space`` composes them
and applies the user's ``--fix`` pins (read by ``autotune.options.parse_fixes``). ``Space`` asks
Optuna for a configuration and turns one into Optuna's params and back.
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.config import KnobValue, Layout, TrialConfig
from autotune.errors import UsageError
from autotune.probes import MachineLike, as_machine
from autotune.probes.cuda_visible import usable_gpus
from autotune.runtime.json_value import JsonObject
from autotune.runtime.knobs import DEFAULT_OPTIMIZER, Backend, Device, LrScaling, Precision
from autotune.space import conditional
from autotune.space.choices import (
    KnobChoice,
    affinity_choice,
    allocator_choice,
    backend_choice,
    batch_ladder,
    batch_size_choice,
    channels_last_choice,
    checkpointing_choice,
    compile_choice,
    cudnn_benchmark_choice,
    device_choice,
    grad_accum_choice,
    interop_threads_choice,
    ipex_choice,
    layout_choice,
    num_workers_choice,
    pairable,
    pin_memory_choice,
    precision_choice,
    prune_ratio_choice,
    sharding_choice,
)
from autotune.space.gpu import gpu_knob_choices, late_params, normalised

__all__ = ["LATE_KNOBS", "MEMORY_KNOBS", "Space", "Unsplittable", "build_space"]

# Knobs whose every trial carries a long one-time cost (torch.compile takes tens of
# seconds even for a small model on a few cores). Sampling them throughout would spend
# the budget compiling; they are tried on the best configuration near the end instead.
LATE_KNOBS = ("compile", "float8")  # float8 pays only compiled (space.gpu.late_params)
# Knobs that spend speed to save memory: a configuration that fits needs none of them, so
# they are not sampled; a trial that retries one that ran out of memory (``Role.MEMORY``,
# ``autotune.search.memory.rescue``) asks for them.
MEMORY_KNOBS = ("activation_checkpointing", "grad_accum", "sharding")


class Unsplittable(UsageError):
    """A sampled global batch that the sampled ranks cannot split evenly: the pair is
    skipped, its knobs are kept."""


@dataclasses.dataclass
class Space:
    """Values per knob on this machine; ``excluded`` holds "knob[=value]" -> reason."""

    choices: dict[str, list[Any]]
    excluded: dict[str, str]
    baseline: TrialConfig
    fixed: dict[str, KnobValue]

    @property
    def grid_size(self) -> int:
        """How many configurations the space holds: what an exhaustive grid would measure
        (the (layout, batch) pairs whose ranks split the batch)."""
        product, paired = conditional.conditional_count(self.choices, self.fixed, self.baseline)
        others = product * math.prod(len(v) for k, v in self.choices.items()
                                         if k not in ("layout", "batch_size", *MEMORY_KNOBS, *paired))
        batches = self.choices.get("batch_size") or [self.fixed.get("batch_size", self.baseline.batch_size)]
        pairs = sum(1 for layout in self.layouts for b in batches if b % layout.nprocs == 0)
        return others * max(1, pairs)

    @property
    def layouts(self) -> list[Layout]:
        return [Layout.parse(s) for s in self.choices["layout"]]

    def suggest(self, trial: Any, *, late: bool = False, memory: bool = False) -> TrialConfig:
        """Ask an Optuna trial for every searched knob; pinned knobs stay pinned.
        Late knobs (LATE_KNOBS) are asked only when ``late``: they are tried on the best
        configuration at the end of the search, not sampled throughout; memory knobs
        (MEMORY_KNOBS) only when ``memory``: a trial enqueued with them (a configuration
        holding less, or a refinement of one), never a sampled one."""
        params: dict[str, KnobValue] = {}
        for name, values in self.choices.items():
            if (name in LATE_KNOBS and not late) or (name in MEMORY_KNOBS and not memory):
                params[name] = values[0]
            else:
                params[name] = values[0] if len(values) == 1 else trial.suggest_categorical(name, values)
        ranks = Layout.parse(str(params["layout"])).nprocs
        batch = self.fixed.get("batch_size", params.get("batch_size", self.baseline.batch_size))
        if isinstance(batch, int) and batch % ranks:
            raise Unsplittable(f"batch {batch} does not split evenly over {ranks} ranks")
        return self.config_from_params(params)

    def late_variants(self, cfg: TrialConfig) -> list[dict[str, KnobValue]]:
        """Params of ``cfg`` with each value of each late knob it does not have yet."""
        base = self.params_of(cfg)
        out: list[dict[str, KnobValue]] = []
        for name in LATE_KNOBS:
            for value in self.choices.get(name, [])[1:]:
                if base.get(name) != value:
                    out.append(late_params(base, name, value, self.choices))
        return out

    def batch_variants(self, cfg: TrialConfig) -> list[dict[str, KnobValue]]:
        """Params of ``cfg`` at its neighbouring batch sizes and at the largest one.

        Batch size interacts with the other knobs (channels_last, workers, layout): the
        best pairing is rarely among a short search's samples, so the best configuration
        is also tried along this axis at the end."""
        sizes = sorted(self.choices.get("batch_size", []))
        if len(sizes) < 2 or cfg.batch_size not in sizes:
            return []
        base = self.params_of(cfg)
        i = sizes.index(cfg.batch_size)
        picks = [sizes[j] for j in (i + 1, i - 1) if 0 <= j < len(sizes)] + [sizes[-1]]
        return [{**base, "batch_size": b} for b in dict.fromkeys(picks)
                if b != cfg.batch_size and b % cfg.nprocs == 0]

    def config_from_params(self, params: Mapping[str, KnobValue]) -> TrialConfig:
        values = dict(params)
        nprocs, threads = Layout.parse(str(values.pop("layout")))
        base = self.baseline.to_dict()
        if (ratio := values.get("prune_ratio")) is not None:
            values["prune_ratio"] = float(ratio)
        base.update(values)
        base.update(nprocs=nprocs, threads=threads)
        # Workers re-spawned every epoch are pure overhead in a long training run.
        base["persistent_workers"] = int(base["num_workers"] or 0) > 0
        base.update(self.fixed)
        return TrialConfig.from_dict(normalised(base))

    def params_of(self, cfg: TrialConfig) -> dict[str, KnobValue]:
        """The Optuna params that select ``cfg`` (for enqueueing known configurations)."""
        out: dict[str, KnobValue] = {}
        for name, values in self.choices.items():
            value = cfg.layout if name == "layout" else getattr(cfg, name)
            if value not in values:
                raise ValueError(f"{name}={value!r} is outside the space {values}")
            out[name] = value
        return out

    @property
    def recorded(self) -> dict[str, list[Any]]:
        """The searched values as a study records them (search.study.settle_space, a shared
        study's identity), with the learning-rate rule where there is one: the study's
        configurations carry the rule they were measured with, so it is not resumed under
        another --scale-lr."""
        rule = self.baseline.lr_scaling
        return {**self.choices, **({"lr_scaling": [rule]} if rule != LrScaling.NONE else {})}

    def with_batch_top(self, top: int, *, why: str) -> Space:
        """This space with the batch sizes from a quarter of the user's up to ``top``
        (``search.batch_range``), ``why`` saying where ``top`` comes from."""
        if len(self.choices.get("batch_size", [])) < 2:  # pinned
            return self
        base = self.baseline.batch_size
        excluded = {k: v for k, v in self.excluded.items() if not k.startswith("batch_size>")}
        excluded[f"batch_size>{top}"] = why
        return dataclasses.replace(self, choices={**self.choices, "batch_size": batch_ladder(base, top)},
                                   excluded=excluded)

    def with_batches(self, batches: Sequence[int]) -> Space:
        """This space with the batch sizes a stored study was searched over."""
        if len(self.choices.get("batch_size", [])) < 2:  # pinned
            return self
        return dataclasses.replace(self, choices={**self.choices, "batch_size": sorted(batches)})

    def describe(self) -> JsonObject:
        return {
            "included": self.recorded,
            "fixed": dict(self.fixed),
            "excluded": dict(self.excluded),
        }


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def build_space(
    machine: MachineLike,
    *,
    baseline_batch: int = 32,
    dataset_len: int | None = None,
    image_inputs: bool = False,
    batchnorm_layers: Sequence[str] = (),
    blocks: Sequence[str] = (),
    has_evaluate: bool = False,
    has_training_step: bool = False,
    max_quality_drop: float | None = None,
    exact: bool = False,
    fixed: Mapping[str, Any] | None = None,
    batch_range: tuple[int, int] | None = None,
    scale_lr: str = LrScaling.NONE.value,
    optimizer: str = DEFAULT_OPTIMIZER,
    convolutions: bool = True,
) -> Space:
    """The space for ``machine`` (a probe, or its saved document) and the model.

    ``fixed`` (``--fix``) pins knobs: a searched knob keeps only its pinned value; a pin
    of a knob the space leaves out stays in ``Space.fixed`` and applies to every trial.
    ``exact`` pins fp32 and no pruning. ``blocks``: the model's repeated block classes, which
    activation checkpointing recomputes. ``batch_range``: the global batches the user allows
    (``--batch-range``), else a quarter to eight times theirs. ``scale_lr``: how the learning
    rate follows each configuration's batch size from the user's (``--scale-lr``); the
    baseline carries it, and so every configuration made from it. ``optimizer``: the model
    file's optimizer class (Task.optimizer), whose step may be fused. ``convolutions``: whether
    the model has convolution layers, whose algorithms cuDNN's benchmark picks."""
    probe = as_machine(machine)
    pins = dict(fixed or {})
    if exact:
        pins.update(precision=Precision.FP32, prune_ratio=0.0)
    cores = int(probe.cpu.usable_cores or 1)
    backends = probe.backends or {Backend.GLOO: True}
    gpus, hidden = usable_gpus(probe, os.environ.get("CUDA_VISIBLE_DEVICES"))
    where = device_choice(gpus, hidden, cuda_available=bool(probe.torch.cuda_available),
                          pinned=pins.pop("device", None), present=len(probe.gpus))
    device = where.values[0]
    layout = layout_choice(device, cores, len(gpus), backends, batchnorm_layers=batchnorm_layers,
                           nprocs=pins.pop("nprocs", None), threads=pins.pop("threads", None))
    batch = batch_size_choice(baseline_batch, dataset_len, pins.pop("batch_size", None), batch_range)
    split = pairable(layout.values, batch.values)
    max_ranks = max(Layout.parse(s).nprocs for s in split.values)
    # Layout and batch size are pinned by their builders; the other knobs below.
    choices: dict[str, list[Any]] = {"layout": split.values, "batch_size": batch.values}
    excluded = {**where.excluded, **layout.excluded, **batch.excluded, **split.excluded}
    workers = num_workers_choice(device, cores, len(gpus))
    knobs = {
        "backend": backend_choice(device, backends, max_ranks),
        "num_workers": workers,
        "prefetch_factor": KnobChoice(*conditional.prefetch_factor_choice(workers.values, pins.get("num_workers"))),
        "pin_memory": pin_memory_choice(device),
        "interop_threads": interop_threads_choice(device),
        "compile": compile_choice(device, probe.compile),
        "precision": precision_choice(device, gpus, probe.cpu.isa or {}, exact=exact),
        "channels_last": channels_last_choice(image_inputs),
        "prune_ratio": prune_ratio_choice(exact=exact, has_evaluate=has_evaluate,
                                          has_training_step=has_training_step,
                                          max_quality_drop=max_quality_drop,
                                          pruning_installed=_has_module("torch_pruning")),
        "allocator": allocator_choice(device, probe.allocators),
        "affinity": affinity_choice(device),
        "ipex": ipex_choice(device, probe.ipex),
        "cudnn_benchmark": cudnn_benchmark_choice(device, convolutions=convolutions),
        "activation_checkpointing": checkpointing_choice(blocks),
        "grad_accum": grad_accum_choice(batchnorm_layers),
        "sharding": sharding_choice(max_ranks),
        "optimizer_step": KnobChoice(*conditional.optimizer_step_choice(device, optimizer,
                                                                         torch=probe.torch.version)),
    }
    for name, choice in knobs.items():
        excluded.update(choice.excluded)
        if choice.values:
            choices[name] = [pins.pop(name)] if name in pins else choice.values
    gpu_values, gpu_excluded = gpu_knob_choices(device, gpus, max_ranks, choices)
    excluded.update(gpu_excluded)
    choices.update({name: [pins.pop(name)] if name in pins else values for name, values in gpu_values.items()})
    baseline = TrialConfig(batch_size=baseline_batch, device=device,
                           backend=Backend.NCCL if device == Device.CUDA else Backend.GLOO,
                           lr_scaling=LrScaling(scale_lr),
                           # none: the configurations of a run without the rule, as before it
                           lr_batch=None if scale_lr == LrScaling.NONE else baseline_batch)
    return Space(choices=choices, excluded=excluded, baseline=baseline, fixed=pins)
