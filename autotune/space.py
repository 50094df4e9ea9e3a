"""The search space: which knobs exist on this machine, and why the others do not.

Built from the machine probe (``probes``) and the model file (``Task``); every value
the search skips comes with its reason, shown by ``autotune probe`` and ``run``.
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.config import Layout, TrialConfig
from autotune.errors import UsageError

# Knobs whose every trial carries a long one-time cost (torch.compile: ~35 s for a
# small CNN on 2 cores). Sampling them throughout would spend the budget compiling;
# they are tried on the best configuration near the end of the search instead.
LATE_KNOBS = ("compile",)

# Knobs the user may pin with --fix, with how to read their value.
_BOOL = {"true": True, "1": True, "yes": True, "on": True,
         "false": False, "0": False, "no": False, "off": False}


def _parse_value(field: dataclasses.Field, text: str) -> Any:
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
        if name not in fields:
            raise UsageError(
                f"--fix {name}: unknown knob. Knobs: {', '.join(sorted([*fields, 'layout']))}"
            )
        fixed[name] = _parse_value(fields[name], text.strip())
    try:
        TrialConfig(**{"batch_size": 1 * fixed.get("nprocs", 1), **fixed})
    except UsageError as exc:
        raise UsageError(f"--fix: {exc}") from None
    return fixed


def _powers_of_two_around(base: int, *, below: int = 2, above: int = 3) -> list[int]:
    """base itself plus powers of two from base/2**below to base*2**above."""
    p = 2 ** round(math.log2(base))
    values = {base} | {int(p * 2.0**k) for k in range(-below, above + 1)}
    return sorted(v for v in values if v >= 1)


@dataclasses.dataclass
class Space:
    """Values per knob on this machine; ``excluded`` holds "knob[=value]" -> reason."""

    choices: dict[str, list[Any]]
    excluded: dict[str, str]
    baseline: TrialConfig
    fixed: dict[str, Any]

    @property
    def grid_size(self) -> int:
        """How many configurations the space holds: what an exhaustive grid would measure."""
        return math.prod(len(values) for values in self.choices.values())

    @property
    def layouts(self) -> list[tuple[int, int]]:
        return [Layout.parse(s) for s in self.choices["layout"]]

    def suggest(self, trial: Any, *, late: bool = False) -> TrialConfig:
        """Ask an Optuna trial for every searched knob; pinned knobs stay pinned.
        Late knobs (LATE_KNOBS) are asked only when ``late``: they are tried on the best
        configuration at the end of the search, not sampled throughout."""
        params: dict[str, Any] = {}
        for name, values in self.choices.items():
            if name in LATE_KNOBS and not late:
                params[name] = values[0]
            else:
                params[name] = values[0] if len(values) == 1 else trial.suggest_categorical(name, values)
        return self.config_from_params(params)

    def late_variants(self, cfg: TrialConfig) -> list[dict[str, Any]]:
        """Params of ``cfg`` with each value of each late knob it does not have yet."""
        base = self.params_of(cfg)
        out = []
        for name in LATE_KNOBS:
            for value in self.choices.get(name, [])[1:]:
                if base.get(name) != value:
                    out.append({**base, name: value})
        return out

    def batch_variants(self, cfg: TrialConfig) -> list[dict[str, Any]]:
        """Params of ``cfg`` at its neighbouring batch sizes and at the largest one.

        Batch size interacts with the other knobs (channels_last, workers, layout): the
        best pair is rarely among a short search's samples, so the best configuration is
        tried along this axis at the end (cifar_cnn, benchmark run 3: the search's best
        was batch 64 and it never sampled 512 with those knobs; batch 512 with channels_last
        and one worker re-measured 1.68x over the baseline, the emitted configuration 1.46x)."""
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
        return TrialConfig(**base)

    def params_of(self, cfg: TrialConfig) -> dict[str, Any]:
        """The Optuna params that select ``cfg`` (for enqueueing known configurations)."""
        out = {}
        for name, values in self.choices.items():
            value = cfg.layout if name == "layout" else getattr(cfg, name)
            if value not in values:
                raise ValueError(f"{name}={value!r} is outside the space {values}")
            out[name] = value
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "included": {k: v for k, v in self.choices.items()},
            "fixed": dict(self.fixed),
            "excluded": dict(self.excluded),
        }


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def visible_gpus(gpus: Sequence[Mapping[str, Any]],
                 cuda_visible_devices: str | None) -> tuple[list[Mapping[str, Any]], list[str]]:
    """The GPUs torch will see, in its order, and the indices of those it will not.
    NVML lists every GPU of the machine; CUDA_VISIBLE_DEVICES (indices or UUIDs, comma
    separated; the list ends at the first entry that names no GPU, as CUDA reads it)
    narrows them, and an empty value hides all."""
    if cuda_visible_devices is None:
        return list(gpus), []
    visible = []
    for entry in (e.strip() for e in cuda_visible_devices.split(",")):
        by_uuid = entry.startswith(("GPU-", "MIG-"))
        match = next((g for g in gpus if entry and (
            str(g.get("uuid", "")).startswith(entry) if by_uuid else str(g.get("index")) == entry)),
            None)
        if match is None or match in visible:
            break
        visible.append(match)
    hidden = [str(g.get("index")) for g in gpus if g not in visible]
    return visible, hidden


def build_space(
    machine: Mapping[str, Any],
    *,
    baseline_batch: int = 32,
    dataset_len: int | None = None,
    image_inputs: bool = False,
    batchnorm_layers: Sequence[str] = (),
    has_evaluate: bool = False,
    max_quality_drop: float | None = None,
    exact: bool = False,
    fixed: Mapping[str, Any] | None = None,
) -> Space:
    fixed = dict(fixed or {})
    if exact:
        fixed.update(precision="fp32", prune_ratio=0.0)
    cpu = machine.get("cpu") or {}
    cores = int(cpu.get("usable_cores") or 1)
    isa = cpu.get("isa") or {}
    torch_info = machine.get("torch") or {}
    gpus, hidden = visible_gpus(machine.get("gpus") or [], os.environ.get("CUDA_VISIBLE_DEVICES"))
    cuda = bool(gpus) and bool(torch_info.get("cuda_available"))
    backends = machine.get("backends") or {"gloo": True}
    excluded: dict[str, str] = {}
    choices: dict[str, list[Any]] = {}

    def pin(name: str, values: list[Any]) -> None:
        choices[name] = [fixed.pop(name)] if name in fixed else values

    # Device. A GPU machine tunes on its GPUs; the CPU layouts stay for CPU-only boxes.
    if fixed.get("device") == "cuda" and not cuda:
        raise UsageError("--fix device=cuda: no CUDA GPU usable by torch on this machine")
    device = fixed.pop("device", "cuda" if cuda else "cpu")
    if hidden:
        excluded[f"gpus={','.join(hidden)}"] = "hidden by CUDA_VISIBLE_DEVICES"
    if not gpus:
        excluded["device=cuda"] = "no NVIDIA GPU found" + (" visible" if hidden else "")
    elif not cuda:
        excluded["device=cuda"] = "GPUs present but this torch build cannot use them"

    # Process layout: ranks x threads within the usable cores (CPU); ranks <= GPUs (CUDA).
    if device == "cuda":
        layouts = [f"{n}x{max(1, cores // n)}" for n in range(1, len(gpus) + 1)]
        if len(gpus) > 1 and not backends.get("nccl"):
            layouts = layouts[:1]
            excluded["nprocs>1"] = "NCCL did not initialise on this machine"
    else:
        layouts = [f"{n}x{t}" for n in range(1, cores + 1) for t in range(1, cores // n + 1)]
        if not backends.get("gloo"):
            layouts = [s for s in layouts if s.startswith("1x")]
            excluded["nprocs>1"] = "the gloo backend did not initialise on this machine"
        if cores == 1:
            excluded["nprocs>1"] = "only one usable core"
    if batchnorm_layers and any(not s.startswith("1x") for s in layouts):
        # DDP normalizes each rank's share of the batch on its own (SyncBatchNorm runs
        # on GPUs only and is not applied): the loss no longer matches one process, and
        # verification's numerics check rejects every such candidate (measured on
        # bench/workloads/cifar_cnn.py: step losses up to 34% apart). Searching them would
        # only spend the budget on configurations that cannot be emitted.
        shown = ", ".join(f"'{n}'" for n in list(batchnorm_layers)[:3])
        reason = (f"the model has BatchNorm layers ({shown}{', ...' if len(batchnorm_layers) > 3 else ''}): "
                  "with several ranks each normalizes over its own share of the batch, which "
                  "changes training, so the numerics check would reject it")
        if fixed.get("nprocs", 1) > 1:
            raise UsageError(f"--fix nprocs={fixed['nprocs']}: {reason}. Remove the --fix, or "
                             "replace BatchNorm (e.g. GroupNorm) if you need several ranks.")
        layouts = [s for s in layouts if s.startswith("1x")]
        excluded["nprocs>1"] = reason
    if "nprocs" in fixed:
        layouts = [s for s in layouts if Layout.parse(s).nprocs == fixed["nprocs"]]
    if fixed.get("threads") is not None:
        layouts = [s for s in layouts if Layout.parse(s).threads == fixed["threads"]]
    if not layouts:
        raise UsageError(
            f"--fix nprocs/threads leaves no layout within the {cores} usable cores "
            "(ranks x threads must not exceed them)"
        )
    fixed.pop("nprocs", None)
    fixed.pop("threads", None)
    choices["layout"] = layouts
    max_ranks = max(Layout.parse(s).nprocs for s in layouts)


    if "batch_size" in fixed:
        batches = [fixed["batch_size"]]
    else:
        batches = _powers_of_two_around(baseline_batch)
        if dataset_len:
            if any(b > dataset_len for b in batches):
                excluded["batch_size>" + str(dataset_len)] = "larger than the dataset"
            batches = [b for b in batches if b <= dataset_len] or [baseline_batch]
    # Every layout must split every batch evenly over its ranks: a rank count that does
    # not divide the batch sizes (3 ranks, powers of two) goes, not the batches.
    even = [s for s in layouts if all(b % Layout.parse(s).nprocs == 0 for b in batches)]
    dropped = [s for s in layouts if s not in even]
    if dropped:
        excluded["layout=" + ",".join(dropped)] = "its ranks do not split the batch sizes evenly"
    choices["layout"] = layouts = even or layouts[:1]
    max_ranks = max(Layout.parse(s).nprocs for s in layouts)
    pin("batch_size", batches)

    if device == "cuda":
        pin("backend", ["nccl"])
        excluded["backend=gloo"] = "on GPUs NCCL is the backend that helps"
    else:
        cpu_backends = ["gloo"] + (["ccl"] if backends.get("ccl") else [])
        if not backends.get("ccl"):
            excluded["backend=ccl"] = "oneccl_bindings_for_pytorch is not installed"
        pin("backend", cpu_backends if max_ranks > 1 else ["gloo"])
    excluded["backend=mpi"] = "needs an MPI launcher (mpirun); autotune starts its ranks itself, on one machine"

    pin("num_workers", list(range(0, min(cores, 4) + 1)))
    if device == "cuda":
        pin("pin_memory", [False, True])
    else:
        excluded["pin_memory"] = "pinned memory only helps copies to a GPU"

    pin("interop_threads", [None, 1])

    compile_modes = ["off"]
    comp = machine.get("compile") or {}
    if device == "cpu" and not comp.get("available", False):
        excluded["compile"] = f"torch.compile needs a working C++ compiler: {comp.get('reason') or 'none found'}"
    else:
        compile_modes += ["default", "max-autotune-no-cudagraphs"]
        if device == "cuda":
            compile_modes += ["reduce-overhead"]
        else:
            excluded["compile=reduce-overhead"] = "CUDA graphs: a no-op on CPU"
    pin("compile", compile_modes)

    precisions = ["fp32"]
    capability = max((float(g.get("compute_capability") or 0) for g in gpus), default=0.0)
    if device == "cuda":
        precisions += ["fp16"]
        if capability >= 8.0:
            precisions += ["bf16", "tf32"]
        else:
            excluded["precision=bf16,tf32"] = "needs an Ampere or later GPU (compute capability 8.0)"
    else:
        if isa.get("avx512_bf16") or isa.get("amx_bf16"):
            precisions.append("bf16")
        else:
            excluded["precision=bf16"] = (
                "CPU has no avx512_bf16/AMX: bf16 autocast would be emulated and about 2x slower"
            )
        excluded["precision=fp16"] = "fp16 autocast with GradScaler needs a CUDA GPU"
        excluded["precision=tf32"] = "tf32 needs an Ampere or later NVIDIA GPU"
    if exact and len(precisions) > 1:
        excluded["precision=" + ",".join(precisions[1:])] = "--exact keeps fp32"
    pin("precision", precisions)

    if image_inputs:
        pin("channels_last", [False, True])
    else:
        excluded["channels_last"] = "the model's inputs are not 4-D image batches"

    quality_reasons = ["--exact keeps the model unpruned"] if exact else []
    if not has_evaluate:
        quality_reasons.append("the model file has no evaluate(model)")
    if max_quality_drop is None:
        quality_reasons.append("no --max-quality-drop given")
    if not _has_module("torch_pruning"):
        quality_reasons.append("torch-pruning is not installed (pip install torch-pruning)")
    if quality_reasons:
        excluded["prune_ratio"] = "structured pruning trades quality: " + "; ".join(quality_reasons)
    else:
        pin("prune_ratio", [0.0, 0.1, 0.25, 0.5])

    if device == "cpu":
        allocators = ["default"] + [name for name, path in (machine.get("allocators") or {}).items()
                                    if path]
        for name in ("jemalloc", "tcmalloc"):
            if name not in allocators:
                excluded[f"allocator={name}"] = f"lib{name} was not found on this machine"
        pin("allocator", allocators)
        pin("affinity", ["none", "compact"])
    else:
        excluded["allocator"] = "host allocators matter little when the GPU does the work"

    ipex = machine.get("ipex") or {}
    if device == "cpu" and ipex.get("compatible"):
        pin("ipex", [False, True])
    else:
        excluded["ipex"] = f"intel-extension-for-pytorch: {ipex.get('reason') or 'not usable'}"

    leftover = {k: v for k, v in fixed.items()}
    baseline = TrialConfig(batch_size=baseline_batch, device=device,
                           backend="nccl" if device == "cuda" else "gloo")
    return Space(choices=choices, excluded=excluded, baseline=baseline, fixed=leftover)
