"""The vocabulary of a configuration, and the settings train_tuned.py reads.

Stdlib only: ``autotune.config`` takes its vocabularies from here, and a trial process
imports it before torch. Each vocabulary is an enum that is also a string: the
configuration travels as JSON (a trial's spec, train_tuned.json), where a knob is its
value, and ``"bf16" == Precision.BF16``.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math
from typing import TypedDict

from .json_value import JsonObject


class Device(str, enum.Enum):
    """Where a trial trains: the host's cores, or NVIDIA GPUs (one per rank)."""

    CPU = "cpu"
    CUDA = "cuda"

    def __str__(self) -> str:
        return self.value


class Affinity(str, enum.Enum):
    """How a CPU rank's threads are placed: NONE leaves them to the scheduler; COMPACT pins
    each rank's threads to its own consecutive cores."""

    NONE = "none"
    COMPACT = "compact"

    def __str__(self) -> str:
        return self.value


class Precision(str, enum.Enum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    TF32 = "tf32"  # fp32 with TF32 matrix products on CUDA

    def __str__(self) -> str:
        return self.value


class CompileMode(str, enum.Enum):
    """torch.compile's mode; OFF does not compile."""

    OFF = "off"
    DEFAULT = "default"
    MAX_AUTOTUNE = "max-autotune"
    MAX_AUTOTUNE_NO_CUDAGRAPHS = "max-autotune-no-cudagraphs"
    REDUCE_OVERHEAD = "reduce-overhead"

    def __str__(self) -> str:
        return self.value


class Allocator(str, enum.Enum):
    """The memory allocator preloaded into the process (DEFAULT: glibc's)."""

    DEFAULT = "default"
    JEMALLOC = "jemalloc"
    TCMALLOC = "tcmalloc"

    def __str__(self) -> str:
        return self.value


class Backend(str, enum.Enum):
    """torch.distributed's backend between several ranks."""

    GLOO = "gloo"
    NCCL = "nccl"
    CCL = "ccl"
    MPI = "mpi"

    def __str__(self) -> str:
        return self.value


class Sharding(str, enum.Enum):
    """How several ranks hold the model: OFF replicates it (DistributedDataParallel);
    FULL shards weights, gradients and optimizer state and gathers each block's weights
    for its forward and again for its backward (FSDP2 ``fully_shard``,
    ``reshard_after_forward=True``: ZeRO-3, PyTorch's FULL_SHARD); GRAD_OP keeps a block's
    gathered weights from its forward to its backward (``reshard_after_forward=False``:
    ZeRO-2-like, SHARD_GRAD_OP), one all-gather a step fewer for more memory."""

    OFF = "off"
    FULL = "full"
    GRAD_OP = "grad-op"

    def __str__(self) -> str:
        return self.value


# What runtime.model.build_model builds for a model file without build_optimizer (Task.optimizer).
DEFAULT_OPTIMIZER = "torch.optim.adamw.AdamW"


class OptimizerStep(str, enum.Enum):
    """How the optimizer's step runs over the parameters: DEFAULT as the user built it
    (torch picks: foreach on CUDA, a loop over the tensors on CPU); FOREACH, one kernel per
    operation over all tensors; FUSED, the whole update in one kernel per group (a torch.optim
    class with a ``fused`` argument: Adam, AdamW, SGD, Adagrad). See runtime.optimizer_step."""

    DEFAULT = "default"
    FOREACH = "foreach"
    FUSED = "fused"

    def __str__(self) -> str:
        return self.value


class LrScaling(str, enum.Enum):
    """How the learning rate follows a batch size unlike the one it was set for: NONE
    leaves it; LINEAR multiplies it by the batches' ratio (Goyal et al.'s rule, for SGD);
    SQRT by the ratio's square root (the rule often used with Adam)."""

    NONE = "none"
    LINEAR = "linear"
    SQRT = "sqrt"

    def __str__(self) -> str:
        return self.value


def lr_factor(rule: str, *, batch: int, lr_batch: int | None) -> float:
    """What the learning rate is multiplied by at the global batch ``batch`` when it was set
    for ``lr_batch`` (None: unknown, and then nothing is scaled)."""
    if rule == LrScaling.NONE or lr_batch is None:
        return 1.0
    ratio = batch / lr_batch
    return ratio if rule == LrScaling.LINEAR else math.sqrt(ratio)


class ConfigDict(TypedDict, total=False):
    """A configuration as the runtime reads it: ``autotune.config.TrialConfig.to_dict()``,
    from a trial's spec or train_tuned.json. A knob left out reads as its default."""

    nprocs: int
    threads: int | None
    backend: str
    interop_threads: int | None
    batch_size: int
    num_workers: int
    pin_memory: bool
    persistent_workers: bool
    prefetch_factor: int | None
    compile: str
    precision: str
    channels_last: bool
    prune_ratio: float
    allocator: str
    affinity: str
    ipex: bool
    device: str
    cudnn_benchmark: bool
    activation_checkpointing: bool
    grad_accum: int
    sharding: str
    optimizer_step: str
    lr_scaling: str
    lr_batch: int | None
    # GPU knobs (runtime.gpu_knobs)
    expandable_segments: bool
    float8: bool
    ddp_bucket_view: bool
    ddp_static_graph: bool


@dataclasses.dataclass(frozen=True)
class ScriptSettings:
    """What train_tuned.json holds: the data train_tuned.py runs with.

    ``model_file`` is relative to the file's folder (a folder moved together with the
    project), ``model_file_tuned`` where the model file was when tuned; ``tuned_for``, the
    machine facts the script warns about when they differ where it runs;
    ``baseline_batch``, the user's batch size, for the learning-rate note when the tuned
    one differs; ``description``, the script's --help text."""

    config: ConfigDict
    description: str
    model_file: str
    model_file_tuned: str
    tuned_for: JsonObject
    baseline_batch: int | None

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2) + "\n"

    @classmethod
    def read(cls, path: str) -> ScriptSettings:
        with open(path) as f:
            data = json.load(f)
        return cls(**{field.name: data[field.name] for field in dataclasses.fields(cls)})
