"""The search space: which knobs exist on this machine, and why the others do not.

Built from the machine probe (``autotune.probes.Machine``) and the model file
(``Task``). Each knob has a small builder that returns its candidate values and a
reason for every value it leaves out; ``build_space`` composes them and applies the
user's ``--fix`` pins. The reasons are shown by ``autotune probe`` and ``run``.
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from autotune import space_conditional as conditional
from autotune.config import LR_FIELDS, LR_SCALINGS, Layout, TrialConfig
from autotune.errors import UsageError
from autotune.gpu_space import gpu_knob_choices, late_params, normalised
from autotune.probes import Machine, as_machine
from autotune.probes.gpu import GpuInfo, usable_gpus
from autotune.runtime.knobs import Allocator, Backend, CompileMode, LrScaling, Precision, Sharding

# Knobs whose every trial carries a long one-time cost (torch.compile takes tens of
# seconds even for a small model on a few cores). Sampling them throughout would spend
# the budget compiling; they are tried on the best configuration near the end instead.
LATE_KNOBS = ("compile", "float8")  # float8 pays only compiled (gpu_space.late_params)
# Knobs that spend speed to save memory: a configuration that fits needs none of them, so
# they are not sampled; a trial that retries one that ran out of memory (``Role.MEMORY``,
# ``autotune.search.memory.rescue``) asks for them.
MEMORY_KNOBS = ("activation_checkpointing", "grad_accum", "sharding")
GRAD_ACCUM_STEPS = [1, 2, 4, 8, 16, 32]

# Knobs the user may pin with --fix, with how to read their value.
_BOOL = {"true": True, "1": True, "yes": True, "on": True,
         "false": False, "0": False, "no": False, "off": False}


def _parse_value(field: dataclasses.Field[Any], text: str) -> Any:
    kind = str(field.type)
    if text.lower() in ("none", "default") and "None" in kind:
        return None
    try:
        if kind.startswith("int"):
            return int(text)
        if kind.startswith("float"):
            return float(text)
        if kind.startswith("bool"):
            return _BOOL[text.lower()]
    except (ValueError, KeyError):
        raise UsageError(f"--fix {field.name}={text}: expected {kind.replace(' | None', '')}") from None
    return text


def parse_fixes(items: list[str]) -> dict[str, Any]:
    """``["batch_size=64", "precision=fp32"]`` -> typed values; unknown knobs are errors."""
    fields = {f.name: f for f in dataclasses.fields(TrialConfig)}
    fixed: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--fix {item!r}: expected KNOB=VALUE, e.g. --fix batch_size=64")
        if name == "layout":  # as progress lines print it: both knobs at once
            try:
                fixed["nprocs"], fixed["threads"] = Layout.parse(text)
            except UsageError as exc:
                raise UsageError(f"--fix {exc}") from None
            continue
        if name in LR_FIELDS:
            raise UsageError(f"--fix {name}: the learning rate's rule is not a knob; give --scale-lr "
                             f"{{{','.join(LR_SCALINGS)}}} (scale_lr= in tune()), and it follows each "
                             "configuration's batch size from yours")
        if name not in fields:
            raise UsageError(
                f"--fix {name}: unknown knob. Knobs: "
                f"{', '.join(sorted([*(f for f in fields if f not in LR_FIELDS), 'layout']))}"
            )
        fixed[name] = _parse_value(fields[name], text.strip())
    try:
        TrialConfig(**{"batch_size": 1 * fixed.get("nprocs", 1), **fixed})
    except UsageError as exc:
        raise UsageError(f"--fix: {exc}") from None
    return fixed


def default_batch_top(base: int) -> int:
    """The largest batch of the default range: eight times the user's ``base``, rounded to
    its nearest power of two (the range without --batch-range or a measured one)."""
    return max(base, 2 ** round(math.log2(base)) * 8)


def batch_ladder(base: int, top: int) -> list[int]:
    """``base`` and ``top``, and the powers of two from a quarter of ``base`` up to ``top``."""
    p = 2 ** round(math.log2(base))
    values = {base, max(base, top)} | {p >> k for k in (1, 2)} | {p << k for k in range(64) if p << k <= top}
    return sorted(v for v in values if v >= 1)


class Unsplittable(UsageError):
    """A sampled global batch that the sampled ranks cannot split evenly: the pair is
    skipped, its knobs are kept."""


@dataclasses.dataclass
class Space:
    """Values per knob on this machine; ``excluded`` holds "knob[=value]" -> reason."""

    choices: dict[str, list[Any]]
    excluded: dict[str, str]
    baseline: TrialConfig
    fixed: dict[str, Any]

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
        params: dict[str, Any] = {}
        for name, values in self.choices.items():
            if (name in LATE_KNOBS and not late) or (name in MEMORY_KNOBS and not memory):
                params[name] = values[0]
            else:
                params[name] = values[0] if len(values) == 1 else trial.suggest_categorical(name, values)
        ranks = Layout.parse(params["layout"]).nprocs
        batch = self.fixed.get("batch_size", params.get("batch_size", self.baseline.batch_size))
        if batch % ranks:
            raise Unsplittable(f"batch {batch} does not split evenly over {ranks} ranks")
        return self.config_from_params(params)

    def late_variants(self, cfg: TrialConfig) -> list[dict[str, Any]]:
        """Params of ``cfg`` with each value of each late knob it does not have yet."""
        base = self.params_of(cfg)
        out: list[dict[str, Any]] = []
        for name in LATE_KNOBS:
            for value in self.choices.get(name, [])[1:]:
                if base.get(name) != value:
                    out.append(late_params(base, name, value, self.choices))
        return out

    def batch_variants(self, cfg: TrialConfig) -> list[dict[str, Any]]:
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

    def config_from_params(self, params: Mapping[str, Any]) -> TrialConfig:
        values = dict(params)
        nprocs, threads = Layout.parse(values.pop("layout"))
        base = self.baseline.to_dict()
        if values.get("prune_ratio") is not None:
            values["prune_ratio"] = float(values["prune_ratio"])
        base.update(values)
        base.update(nprocs=nprocs, threads=threads)
        # Workers re-spawned every epoch are pure overhead in a long training run.
        base["persistent_workers"] = base["num_workers"] > 0
        base.update(self.fixed)
        return TrialConfig(**normalised(base))

    def params_of(self, cfg: TrialConfig) -> dict[str, Any]:
        """The Optuna params that select ``cfg`` (for enqueueing known configurations)."""
        out: dict[str, Any] = {}
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

    def describe(self) -> dict[str, Any]:
        return {
            "included": self.recorded,
            "fixed": dict(self.fixed),
            "excluded": dict(self.excluded),
        }


@dataclasses.dataclass(frozen=True)
class KnobChoice:
    """What one builder decides for its knob: the values to search (empty: the knob is
    not searched at all) and ``"knob[=value]" -> reason`` for each value it leaves out."""

    values: list[Any]
    excluded: dict[str, str] = dataclasses.field(default_factory=dict)


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def _ranks(layout: str) -> int:
    return Layout.parse(layout).nprocs


def _device_choice(gpus: Sequence[GpuInfo], hidden: Sequence[str], *, cuda_available: bool,
                   pinned: str | None, present: int = 0) -> KnobChoice:
    """The one device to tune on: a GPU machine tunes on the GPUs torch sees, anything
    else on CPU. ``present``: the GPUs NVML found, to say why torch's are missing."""
    cuda = bool(gpus) and cuda_available
    if pinned == "cuda" and not cuda:
        raise UsageError("--fix device=cuda: no CUDA GPU usable by torch on this machine")
    excluded: dict[str, str] = {}
    if hidden:
        excluded[f"gpus={','.join(hidden)}"] = "hidden by CUDA_VISIBLE_DEVICES"
    if (present or gpus) and not cuda_available:
        excluded["device=cuda"] = "GPUs present but this torch build cannot use them"
    elif not gpus:
        excluded["device=cuda"] = "no NVIDIA GPU found" + (" visible" if hidden else "")
    return KnobChoice([pinned or ("cuda" if cuda else "cpu")], excluded)


def _machine_layouts(device: str, cores: int, gpu_count: int, backends: Mapping[str, bool]) -> KnobChoice:
    """Layouts (``RANKSxTHREADS``) the hardware allows: on CPU every split of the usable
    cores into ranks x threads; on CUDA one to ``gpu_count`` ranks, one per GPU, several
    each with an equal share of the cores, and one with PyTorch's default threads, as the
    baseline has them: the GPU does the work, so a thread count of its own would only make
    one rank differ from the baseline in nothing that matters (and the ablation measure
    that difference). Several ranks need a working backend."""
    if device == "cuda":
        layouts = ["1xdefault"] + [f"{n}x{max(1, cores // n)}" for n in range(2, gpu_count + 1)]
        if gpu_count > 1 and not backends.get(Backend.NCCL):
            return KnobChoice(layouts[:1], {"nprocs>1": "NCCL did not initialise on this machine"})
        return KnobChoice(layouts)
    layouts = [f"{n}x{t}" for n in range(1, cores + 1) for t in range(1, cores // n + 1)]
    excluded: dict[str, str] = {}
    if not backends.get(Backend.GLOO):
        layouts = [s for s in layouts if _ranks(s) == 1]
        excluded["nprocs>1"] = "the gloo backend did not initialise on this machine"
    if cores == 1:
        excluded["nprocs>1"] = "only one usable core"
    return KnobChoice(layouts, excluded)


def _batchnorm_reason(batchnorm_layers: Sequence[str]) -> str:
    shown = ", ".join(f"'{n}'" for n in list(batchnorm_layers)[:3])
    more = ", ..." if len(batchnorm_layers) > 3 else ""
    return (f"the model has BatchNorm layers ({shown}{more}): with several ranks each normalizes "
            "over its own share of the batch, which changes training, so the numerics check "
            "would reject it (on CPU; on GPUs SyncBatchNorm keeps it)")


def _layout_choice(device: str, cores: int, gpu_count: int, backends: Mapping[str, bool], *,
                   batchnorm_layers: Sequence[str], nprocs: int | None, threads: int | None) -> KnobChoice:
    """The machine's layouts, narrowed to one rank for a BatchNorm model on CPU and to
    the pinned ranks (``nprocs``) and threads, when given."""
    machine = _machine_layouts(device, cores, gpu_count, backends)
    layouts, excluded = list(machine.values), dict(machine.excluded)
    if batchnorm_layers and device == "cpu" and any(_ranks(s) > 1 for s in layouts):
        # DDP normalizes each rank's share of the batch on its own: the loss no longer
        # matches one process, and verification's numerics check rejects every such
        # candidate. On GPUs the runtime converts BatchNorm to SyncBatchNorm, which
        # normalizes over the global batch as one process does; on CPU (gloo) that costs
        # an all-gather of statistics per layer per step, so several ranks are not searched.
        reason = _batchnorm_reason(batchnorm_layers)
        if (nprocs or 1) > 1:
            raise UsageError(f"--fix nprocs={nprocs}: {reason}. Remove the --fix, or "
                             "replace BatchNorm (e.g. GroupNorm) if you need several ranks.")
        layouts = [s for s in layouts if _ranks(s) == 1]
        excluded["nprocs>1"] = reason
    if nprocs is not None:
        layouts = [s for s in layouts if _ranks(s) == nprocs]
    if threads is not None and device == "cuda":  # the GPUs' ranks with the pinned threads each
        layouts = [str(Layout(n, threads)) for n in map(_ranks, layouts) if n * threads <= cores]
    elif threads is not None:
        layouts = [s for s in layouts if Layout.parse(s).threads == threads]
    if not layouts:
        raise UsageError(
            f"--fix nprocs/threads leaves no layout within the {cores} usable cores "
            "(ranks x threads must not exceed them)"
        )
    return KnobChoice(layouts, excluded)


def _batch_size_choice(baseline_batch: int, dataset_len: int | None, pinned: int | None,
                       batch_range: tuple[int, int] | None = None) -> KnobChoice:
    """Powers of two around the user's batch size (a quarter to eight times it), or within
    ``batch_range`` (``--batch-range LOW-HIGH``: its powers of two and its ends, the user's
    batch where it lies within), none larger than the dataset."""
    if pinned is not None:
        return KnobChoice([pinned])
    excluded: dict[str, str] = {}
    if batch_range is None:
        batches = batch_ladder(baseline_batch, default_batch_top(baseline_batch))
    else:
        low, high = batch_range
        batches = sorted({low, high, *(2**k for k in range(high.bit_length()) if low <= 2**k <= high),
                          *([baseline_batch] if low <= baseline_batch <= high else [])})
        excluded[f"batch_size<{low},>{high}"] = f"outside --batch-range {low}-{high}"
    if dataset_len and any(b > dataset_len for b in batches):
        excluded[f"batch_size>{dataset_len}"] = "larger than the dataset"
        batches = [b for b in batches if b <= dataset_len] or [baseline_batch]
    return KnobChoice(batches, excluded)


def _pairable(layouts: Sequence[str], batches: Sequence[int]) -> KnobChoice:
    """The layouts whose ranks split at least one batch size evenly. Each sampled
    (layout, batch) pair that does not split is skipped by the search (``Space.splits``),
    so a rank count is never dropped because some other batch size does not suit it
    (8 GPUs at the user's batch 50 still meet batch 16, 32, 64...); the first layout
    stays if none splits any."""
    even = [s for s in layouts if any(b % _ranks(s) == 0 for b in batches)]
    dropped = [s for s in layouts if s not in even]
    excluded = {"layout=" + ",".join(dropped): "its ranks split none of the batch sizes evenly"} if dropped else {}
    return KnobChoice(even or list(layouts[:1]), excluded)


def _backend_choice(device: str, backends: Mapping[str, bool], max_ranks: int) -> KnobChoice:
    """The collective backend: NCCL on GPUs; gloo on CPU, and oneCCL too where it is
    installed and a layout has several ranks for it to matter."""
    excluded: dict[str, str] = {}
    if device == "cuda":
        values = [Backend.NCCL]
        excluded["backend=gloo"] = "on GPUs NCCL is the backend that helps"
    else:
        values = [Backend.GLOO] + ([Backend.CCL] if backends.get(Backend.CCL) and max_ranks > 1 else [])
        if not backends.get(Backend.CCL):
            excluded["backend=ccl"] = "oneccl_bindings_for_pytorch is not installed"
    excluded["backend=mpi"] = "needs an MPI launcher (mpirun); autotune starts its ranks itself, on one machine"
    return KnobChoice(values, excluded)


def _num_workers_choice(device: str, cores: int, gpu_count: int) -> KnobChoice:
    """DataLoader workers: on CPU none up to one per core, at most 4 (they take cores from
    the training threads); on GPUs, where the host cores only feed the devices, up to 8
    per rank within each rank's share of the cores."""
    if device == "cuda":
        per_rank = max(1, cores // max(1, gpu_count))
        return KnobChoice([n for n in (0, 1, 2, 4, 8) if n <= max(1, per_rank)])
    return KnobChoice(list(range(min(cores, 4) + 1)))


def _pin_memory_choice(device: str) -> KnobChoice:
    if device == "cuda":
        return KnobChoice([False, True])
    return KnobChoice([], {"pin_memory": "pinned memory only helps copies to a GPU"})


def _interop_threads_choice(device: str) -> KnobChoice:
    """torch's inter-op pool: its default size, or one thread, on CPU. On GPUs the pool
    runs little (the work is on the device), and the knob is a process knob: each value
    would cost a fresh process per trial for nothing."""
    if device == "cuda":
        return KnobChoice([], {"interop_threads": "torch's inter-op pool does little when the GPU does the "
                                                  "work, and each value needs a process of its own"})
    return KnobChoice([None, 1])


def _compile_choice(device: str, compiler: Mapping[str, Any]) -> KnobChoice:
    """torch.compile modes. Inductor builds C++ on CPU and Triton builds its launchers
    with the host C compiler on GPUs, so both need a working compiler; CUDA graphs
    (reduce-overhead) exist only on GPUs."""
    if not compiler.get("available", False):
        what = "a working C++ compiler" if device == "cpu" else "a C compiler for Triton's launchers"
        reason = f"torch.compile needs {what}: {compiler.get('reason') or 'none found'}"
        return KnobChoice([CompileMode.OFF], {"compile": reason})
    modes = [CompileMode.OFF, CompileMode.DEFAULT, CompileMode.MAX_AUTOTUNE_NO_CUDAGRAPHS]
    if device == "cuda":
        return KnobChoice([*modes, CompileMode.REDUCE_OVERHEAD])
    return KnobChoice(modes, {"compile=reduce-overhead": "CUDA graphs: a no-op on CPU"})


def _cudnn_benchmark_choice(device: str) -> KnobChoice:
    """cuDNN's per-shape algorithm search: off by PyTorch's default (and the baseline's),
    searched on GPUs, where it pays for fixed-shape convolutions and costs at each new shape."""
    return KnobChoice([False, True] if device == "cuda" else [])


def _precision_choice(device: str, gpus: Sequence[GpuInfo], isa: Mapping[str, bool], *,
                      exact: bool) -> KnobChoice:
    """Autocast precisions the hardware runs natively: fp16 on any GPU, bf16 and tf32 on
    Ampere or later; on CPU bf16 only with avx512_bf16 or AMX (emulated it is slower)."""
    values = [Precision.FP32]
    excluded: dict[str, str] = {}
    if device == "cuda":
        values.append(Precision.FP16)
        capability = max((float(g.compute_capability or 0) for g in gpus), default=0.0)
        if capability >= 8.0:
            values += [Precision.BF16, Precision.TF32]
        else:
            excluded["precision=bf16,tf32"] = "needs an Ampere or later GPU (compute capability 8.0)"
    else:
        if isa.get("avx512_bf16") or isa.get("amx_bf16"):
            values.append(Precision.BF16)
        else:
            excluded["precision=bf16"] = (
                "CPU has no avx512_bf16/AMX: bf16 autocast would be emulated and about 2x slower"
            )
        excluded["precision=fp16"] = "fp16 autocast with GradScaler needs a CUDA GPU"
        excluded["precision=tf32"] = "tf32 needs an Ampere or later NVIDIA GPU"
    if exact and len(values) > 1:
        excluded["precision=" + ",".join(values[1:])] = "--exact keeps fp32"
    return KnobChoice(values, excluded)


def _channels_last_choice(image_inputs: bool) -> KnobChoice:
    if image_inputs:
        return KnobChoice([False, True])
    return KnobChoice([], {"channels_last": "the model's inputs are not 4-D image batches"})


def _prune_ratio_choice(*, exact: bool, has_evaluate: bool, has_training_step: bool,
                        max_quality_drop: float | None, pruning_installed: bool) -> KnobChoice:
    """Structured pruning trades quality for speed: it is searched only when the model
    file can measure quality (evaluate), the user bounds the loss, and torch-pruning is
    installed; every missing condition is named. Pruning traces model(inputs), the call
    a file with its own training_step does not promise works."""
    reasons = ["--exact keeps the model unpruned"] if exact else []
    if has_training_step:
        reasons.append("the model file calls its model in training_step, which pruning cannot trace")
    if not has_evaluate:
        reasons.append("the model file has no evaluate(model)")
    if max_quality_drop is None:
        reasons.append("no --max-quality-drop given")
    if not pruning_installed:
        reasons.append("torch-pruning is not installed (pip install torch-pruning)")
    if reasons:
        return KnobChoice([], {"prune_ratio": "structured pruning trades quality: " + "; ".join(reasons)})
    return KnobChoice([0.0, 0.1, 0.25, 0.5])


def _allocator_choice(device: str, allocators: Mapping[str, str | None]) -> KnobChoice:
    """Host allocators to preload on CPU: the default plus each one found on the machine."""
    if device != "cpu":
        return KnobChoice([], {"allocator": "host allocators matter little when the GPU does the work"})
    values = [Allocator.DEFAULT] + [name for name, path in allocators.items() if path]
    excluded = {f"allocator={name}": f"lib{name} was not found on this machine"
                for name in (Allocator.JEMALLOC, Allocator.TCMALLOC) if name not in values}
    return KnobChoice(values, excluded)


def _checkpointing_choice(blocks: Sequence[str]) -> KnobChoice:
    """Recomputing activations applies to the model's repeated blocks (``Task.blocks``)."""
    if not blocks:
        return KnobChoice([], {"activation_checkpointing": "the model has no repeated blocks to recompute"})
    return KnobChoice([False, True])


def _grad_accum_choice(batchnorm_layers: Sequence[str]) -> KnobChoice:
    """Micro-batches per optimizer step. BatchNorm normalizes over what one forward sees:
    over a micro-batch its statistics, and so training, change."""
    if batchnorm_layers:
        return KnobChoice([], {"grad_accum": "the model has BatchNorm layers, which would normalize "
                                             "over each micro-batch instead of the batch"})
    return KnobChoice(list(GRAD_ACCUM_STEPS))


def _sharding_choice(max_ranks: int) -> KnobChoice:
    """Sharding spreads weights, gradients and optimizer state over the ranks (FSDP2)."""
    if max_ranks < 2:
        return KnobChoice([], {"sharding": "one rank: nothing to shard over"})
    return KnobChoice([s.value for s in Sharding])


def _affinity_choice(device: str) -> KnobChoice:
    """Core pinning of CPU ranks; GPU ranks are not pinned."""
    return KnobChoice(["none", "compact"] if device == "cpu" else [])


def _ipex_choice(device: str, ipex: Mapping[str, Any]) -> KnobChoice:
    if device == "cpu" and ipex.get("compatible"):
        return KnobChoice([False, True])
    return KnobChoice([], {"ipex": f"intel-extension-for-pytorch: {ipex.get('reason') or 'not usable'}"})


def build_space(
    machine: Machine | Mapping[str, Any],
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
    optimizer: str = conditional.DEFAULT_OPTIMIZER,
) -> Space:
    """The space for ``machine`` (a probe, or its saved document) and the model.

    ``fixed`` (``--fix``) pins knobs: a searched knob keeps only its pinned value; a pin
    of a knob the space leaves out stays in ``Space.fixed`` and applies to every trial.
    ``exact`` pins fp32 and no pruning. ``blocks``: the model's repeated block classes, which
    activation checkpointing recomputes. ``batch_range``: the global batches the user allows
    (``--batch-range``), else a quarter to eight times theirs. ``scale_lr``: how the learning
    rate follows each configuration's batch size from the user's (``--scale-lr``); the
    baseline carries it, and so every configuration made from it. ``optimizer``: the model
    file's optimizer class (Task.optimizer), whose step may be fused."""
    probe = as_machine(machine)
    pins = dict(fixed or {})
    if exact:
        pins.update(precision=Precision.FP32, prune_ratio=0.0)
    cores = int(probe.cpu.usable_cores or 1)
    backends = probe.backends or {Backend.GLOO: True}
    gpus, hidden = usable_gpus(probe, os.environ.get("CUDA_VISIBLE_DEVICES"))
    device_choice = _device_choice(gpus, hidden, cuda_available=bool(probe.torch.get("cuda_available")),
                                   pinned=pins.pop("device", None), present=len(probe.gpus))
    device = device_choice.values[0]
    layout = _layout_choice(device, cores, len(gpus), backends, batchnorm_layers=batchnorm_layers,
                            nprocs=pins.pop("nprocs", None), threads=pins.pop("threads", None))
    batch = _batch_size_choice(baseline_batch, dataset_len, pins.pop("batch_size", None), batch_range)
    split = _pairable(layout.values, batch.values)
    max_ranks = max(_ranks(s) for s in split.values)
    # Layout and batch size are pinned by their builders; the other knobs below.
    choices: dict[str, list[Any]] = {"layout": split.values, "batch_size": batch.values}
    excluded = {**device_choice.excluded, **layout.excluded, **batch.excluded, **split.excluded}
    workers = _num_workers_choice(device, cores, len(gpus))
    knobs = {
        "backend": _backend_choice(device, backends, max_ranks),
        "num_workers": workers,
        "prefetch_factor": KnobChoice(*conditional.prefetch_factor_choice(workers.values, pins.get("num_workers"))),
        "pin_memory": _pin_memory_choice(device),
        "interop_threads": _interop_threads_choice(device),
        "compile": _compile_choice(device, probe.compile),
        "precision": _precision_choice(device, gpus, probe.cpu.isa or {}, exact=exact),
        "channels_last": _channels_last_choice(image_inputs),
        "prune_ratio": _prune_ratio_choice(exact=exact, has_evaluate=has_evaluate,
                                           has_training_step=has_training_step,
                                           max_quality_drop=max_quality_drop,
                                           pruning_installed=_has_module("torch_pruning")),
        "allocator": _allocator_choice(device, probe.allocators),
        "affinity": _affinity_choice(device),
        "ipex": _ipex_choice(device, probe.ipex),
        "cudnn_benchmark": _cudnn_benchmark_choice(device),
        "activation_checkpointing": _checkpointing_choice(blocks),
        "grad_accum": _grad_accum_choice(batchnorm_layers),
        "sharding": _sharding_choice(max_ranks),
        "optimizer_step": KnobChoice(*conditional.optimizer_step_choice(device, optimizer,
                                                                         torch=probe.torch.get("version"))),
    }
    for name, choice in knobs.items():
        excluded.update(choice.excluded)
        if choice.values:
            choices[name] = [pins.pop(name)] if name in pins else choice.values
    gpu_values, gpu_excluded = gpu_knob_choices(device, gpus, max_ranks, choices)
    excluded.update(gpu_excluded)
    choices.update({name: [pins.pop(name)] if name in pins else values for name, values in gpu_values.items()})
    baseline = TrialConfig(batch_size=baseline_batch, device=device,
                           backend=Backend.NCCL if device == "cuda" else Backend.GLOO,
                           lr_scaling=str(scale_lr),
                           # none: the configurations of a run without the rule, as before it
                           lr_batch=None if scale_lr == LrScaling.NONE else baseline_batch)
    return Space(choices=choices, excluded=excluded, baseline=baseline, fixed=pins)
