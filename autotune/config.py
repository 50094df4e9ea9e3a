"""One candidate training configuration: every knob autotune can turn."""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any, NamedTuple, TypeAlias

from autotune.errors import UsageError
from autotune.runtime.json_value import own_codec
from autotune.runtime.knobs import (
    Affinity,
    Allocator,
    Backend,
    CompileMode,
    Device,
    LrScaling,
    OptimizerStep,
    Precision,
    Sharding,
    lr_factor,
)

# One knob's value as a configuration's fields hold it (``TrialConfig.to_dict``), Optuna's
# params, a --fix pin or a study's record: a vocabulary's member is a str.
KnobValue: TypeAlias = int | float | str | bool | None

# The learning-rate rules' values, as --scale-lr's help lists them.
LR_SCALINGS = tuple(r.value for r in LrScaling)
# The fields that hold a vocabulary's member. A configuration read from JSON (a trial's
# spec, a study, a report) holds their values as strings; the constructor turns them into
# members, so code compares with the enum and never with the spelling.
VOCABULARIES: dict[str, type[enum.Enum]] = {
    "compile": CompileMode,
    "precision": Precision,
    "allocator": Allocator,
    "backend": Backend,
    "affinity": Affinity,
    "device": Device,
    "sharding": Sharding,
    "optimizer_step": OptimizerStep,
    "lr_scaling": LrScaling,
}
# The learning-rate rule's fields: set once for the run (--scale-lr), not searched.
LR_FIELDS = ("lr_scaling", "lr_batch")


class Layout(NamedTuple):
    """Ranks x threads per rank, written ``2x1``; ``1xdefault`` leaves the threads to
    torch (the baseline). The search space stores layouts as these strings."""

    nprocs: int
    threads: int | None

    @classmethod
    def parse(cls, text: str) -> Layout:
        ranks, sep, threads = str(text).strip().partition("x")
        try:
            layout = cls(int(ranks), None if threads == "default" else int(threads))
        except ValueError:
            layout = None
        if (not sep or layout is None or layout.nprocs < 1
                or (layout.threads is not None and layout.threads < 1)):
            raise UsageError(f"layout {text!r}: expected RANKSxTHREADS, e.g. 2x1 (2 ranks of 1 "
                             "thread) or 1xdefault")
        return layout

    def __str__(self) -> str:
        return f"{self.nprocs}x{'default' if self.threads is None else self.threads}"


@dataclasses.dataclass(frozen=True)
class TrialConfig:
    """A configuration as the trial process and the generated script apply it.

    ``batch_size`` is the global batch: with several ranks each rank takes
    ``batch_size // nprocs`` samples, so a layout change never changes what the
    optimizer sees; with ``grad_accum`` micro-batches a rank adds up the gradients of
    ``grad_accum`` slices of its share before one optimizer step, so accumulation
    changes what a step holds in memory, not what the optimizer sees. ``threads=None``
    means PyTorch's own default (the baseline). The memory knobs
    (``activation_checkpointing``, ``grad_accum``, ``sharding``) compute what the model
    without them computes, to rounding.
    """

    nprocs: int = 1
    threads: int | None = None
    backend: Backend = Backend.GLOO
    interop_threads: int | None = None
    batch_size: int = 32
    num_workers: int = 0
    pin_memory: bool = False
    persistent_workers: bool = False
    prefetch_factor: int | None = None
    compile: CompileMode = CompileMode.OFF
    precision: Precision = Precision.FP32
    channels_last: bool = False
    prune_ratio: float = 0.0
    allocator: Allocator = Allocator.DEFAULT
    affinity: Affinity = Affinity.NONE
    ipex: bool = False
    device: Device = Device.CPU
    # cuDNN's per-shape algorithm search: PyTorch leaves it off, and so does the baseline.
    cudnn_benchmark: bool = False
    # Memory knobs: recompute the repeated blocks' activations in the backward pass;
    # micro-batches per optimizer step; how several ranks hold the model.
    activation_checkpointing: bool = False
    grad_accum: int = 1
    sharding: Sharding = Sharding.OFF
    # The optimizer's step implementation (runtime.optimizer_step): rounding only, like the
    # layouts, so ``exact`` holds and the numerics check compares it with the fp32 reference.
    optimizer_step: OptimizerStep = OptimizerStep.DEFAULT
    # Not a knob the search turns: how the learning rate follows the batch size
    # (--scale-lr), and the global batch the user's learning rate is for (theirs).
    lr_scaling: LrScaling = LrScaling.NONE
    lr_batch: int | None = None
    # GPU knobs (runtime.gpu_knobs): the CUDA allocator's expandable segments (a process
    # knob, set in the environment); float8 matmuls through torchao, which pay only
    # compiled and under bf16 autocast; DDP's gradients as bucket views and static graph.
    expandable_segments: bool = False
    float8: bool = False
    ddp_bucket_view: bool = False
    ddp_static_graph: bool = False

    def __post_init__(self) -> None:
        for name, vocabulary in VOCABULARIES.items():
            try:
                object.__setattr__(self, name, vocabulary(getattr(self, name)))
            except (ValueError, TypeError):
                pass  # not one of its values: reported below
        # Knobs that mean nothing beside another's value take their default there, so two
        # configurations that run alike are one (the search counts a repeat as a duplicate):
        # prefetching needs workers; IPEX and sharding keep the optimizer as built (see
        # runtime.optimizer_step.STEP_APPLIES).
        if self.num_workers == 0 and self.prefetch_factor is not None:
            object.__setattr__(self, "prefetch_factor", None)
        if (self.ipex or self.sharding != Sharding.OFF) and self.optimizer_step != OptimizerStep.DEFAULT:
            object.__setattr__(self, "optimizer_step", OptimizerStep.DEFAULT)
        problems = []
        if self.nprocs < 1:
            problems.append(f"nprocs={self.nprocs} must be at least 1")
        if self.threads is not None and self.threads < 1:
            problems.append(f"threads={self.threads} must be at least 1")
        if self.batch_size < 1:
            problems.append(f"batch_size={self.batch_size} must be at least 1")
        elif self.batch_size % self.nprocs:
            problems.append(
                f"batch_size={self.batch_size} is the global batch and must divide evenly "
                f"over nprocs={self.nprocs}"
            )
        elif self.grad_accum >= 1 and self.batch_size % (self.nprocs * self.grad_accum):
            problems.append(
                f"batch_size={self.batch_size} must divide evenly into nprocs={self.nprocs} "
                f"ranks x grad_accum={self.grad_accum} micro-batches")
        if self.grad_accum < 1:
            problems.append(f"grad_accum={self.grad_accum} must be at least 1")
        if self.num_workers < 0:
            problems.append(f"num_workers={self.num_workers} must be 0 or more")
        if self.prefetch_factor is not None and self.prefetch_factor < 1:
            problems.append(f"prefetch_factor={self.prefetch_factor} must be at least 1")
        for name, vocabulary in VOCABULARIES.items():
            if not isinstance(getattr(self, name), vocabulary):
                allowed = ", ".join(member.value for member in vocabulary)
                problems.append(f"{name}={getattr(self, name)!r} is not one of {allowed}")
        if self.lr_batch is not None and self.lr_batch < 1:
            problems.append(f"lr_batch={self.lr_batch} must be at least 1")
        if not 0.0 <= self.prune_ratio < 1.0:
            problems.append(f"prune_ratio={self.prune_ratio} must be in [0, 1)")
        if self.sharding != Sharding.OFF and self.nprocs < 2:
            problems.append(f"sharding={self.sharding} shards over several ranks: it needs nprocs of 2 or more")
        if self.sharding != Sharding.OFF and self.ipex:
            problems.append(f"sharding={self.sharding} and ipex=true: IPEX optimizes an unsharded model")
        if self.float8 and (self.precision != Precision.BF16 or self.compile == CompileMode.OFF):
            problems.append("float8=true needs precision=bf16 and a compile mode: uncompiled or "
                            "outside bf16 autocast its casts cost more than its matmuls save")
        if problems:
            raise UsageError("invalid configuration: " + "; ".join(problems))

    @property
    def per_rank_batch(self) -> int:
        return self.batch_size // self.nprocs

    @property
    def micro_batch(self) -> int:
        """What one rank's forward and backward hold at once."""
        return self.batch_size // (self.nprocs * self.grad_accum)

    @property
    def lr_factor(self) -> float:
        """What the learning rate is multiplied by at this batch size, on one node."""
        return lr_factor(self.lr_scaling, batch=self.batch_size, lr_batch=self.lr_batch)

    @property
    def exact(self) -> bool:
        """fp32 throughout and the model as the user wrote it: nothing that could change
        what training computes beyond rounding order."""
        return self.precision == Precision.FP32 and self.prune_ratio == 0.0 and not self.float8

    @property
    def layout(self) -> str:
        return str(Layout(self.nprocs, self.threads))

    def to_dict(self) -> dict[str, KnobValue]:
        """The fields as JSON and YAML hold them: a vocabulary's member as its value."""
        return {name: value.value if isinstance(value, enum.Enum) else value
                for name, value in dataclasses.asdict(self).items()}

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        # inside a document pydantic reads: as to_dict writes it, unknown knobs refused by name
        return own_codec(cls, read=cls.from_dict, write=cls.to_dict, fields=handler(source))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrialConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(
                f"unknown knob(s) {', '.join(unknown)}; known knobs: {', '.join(sorted(known))}"
            )
        return cls(**data)

    def replace(self, **changes: Any) -> TrialConfig:
        return dataclasses.replace(self, **changes)

    def short(self) -> str:
        """One line naming the knobs that differ from the defaults, for progress output."""
        default = TrialConfig()
        parts = [f"layout={self.layout}", f"batch={self.batch_size}"]
        for f in dataclasses.fields(self):
            if f.name in ("nprocs", "threads", "batch_size", *LR_FIELDS):
                continue
            value = getattr(self, f.name)
            if value != getattr(default, f.name):
                parts.append(f"{f.name}={value}")
        return " ".join(parts)
