"""Where a training step's time goes, from a profiler's events: the categoriser behind
``--profile`` (``profile.py`` runs torch.profiler; this module only reads its events, so it
is tested on recorded ones).

The window is one ``autotune.window`` range holding ``autotune.step`` ranges, each with
its ``autotune.data_wait`` (the time in ``next(batches)``). Every instant of the window is
counted once:

- on CPU, each step's ops are walked from the top: an op whose name says what it is
  (``aten::linear``, ``Optimizer.step#SGD.step``) counts whole; one that does not
  (a compiled region, the loss) is looked into, its own time is "other"; time inside a
  step or the window that no op covers is "idle" (Python between ops, the loop);
- on GPU, kernels over the window's wall time: the first kernel running at an instant
  takes it (streams overlap), and where none runs the device is idle, or waiting for
  data where the host was in ``next(batches)`` then.
"""
from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .json_value import JsonObject

WINDOW = "autotune.window"
STEP = "autotune.step"
DATA_WAIT = "autotune.data_wait"


class Category(str, enum.Enum):
    MATMUL = "matmul"
    CONVOLUTION = "convolution"
    ATTENTION = "attention"
    OTHER = "other"
    OPTIMIZER = "optimizer"
    DATA_WAIT = "data_wait"
    COMMUNICATION = "communication"
    IDLE = "idle"

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    Category.MATMUL: "matrix products (mm, linear)",
    Category.CONVOLUTION: "convolutions (conv, cuDNN)",
    Category.ATTENTION: "attention (scaled_dot_product_attention)",
    Category.OTHER: "other ops and kernels",
    Category.OPTIMIZER: "optimizer step",
    Category.DATA_WAIT: "waiting for data (next batch)",
    Category.COMMUNICATION: "communication (all-reduce, c10d)",
    Category.IDLE: "idle (nothing running)",
}


class ProfilerEventKind(str, enum.Enum):
    CPU = "cpu"  # a host op or record_function range, on one thread
    KERNEL = "kernel"  # device work: a kernel, a memcpy or memset
    # a record_function range on the device's timeline: where the device ran the work
    # launched inside it (the optimizer step's kernels lie inside its range)
    ANNOTATION = "annotation"


@dataclasses.dataclass(frozen=True)
class ProfilerEvent:
    """One profiler event; times in microseconds on the profiler's clock."""

    name: str
    start: float
    duration: float
    kind: ProfilerEventKind = ProfilerEventKind.CPU
    thread: int = 0

    @property
    def end(self) -> float:
        return self.start + self.duration


# Checked in this order: a flash-attention kernel is also a cutlass one (and cuDNN's sdpa
# kernels are cuDNN's), a convolution kernel is often an implicit gemm (``sm80_xmma_fprop_
# implicit_gemm``, ``cutlass_tensorop_s1688fprop``), an optimizer step is made of aten ops.
# Substrings of the lowercased name; a rule's third part: substrings that make it not apply
# (cuDNN also runs batch norm and RNNs, which are not convolutions).
_RULES: tuple[tuple[Category, tuple[str, ...], tuple[str, ...]], ...] = (
    (Category.DATA_WAIT, (DATA_WAIT,), ()),
    (Category.OPTIMIZER, ("optimizer.step", "optimizer.zero_grad", "autotune.optimizer", "multi_tensor_apply",
                          "fused_adam", "fused_sgd", "fusedadam", "fusedsgd"), ()),
    (Category.COMMUNICATION, ("nccl", "gloo", "c10d::", "record_param_comms", "all_reduce", "allreduce",
                              "reduce_scatter", "all_gather", "allgather"), ()),
    (Category.ATTENTION, ("scaled_dot_product", "scaleddotproduct", "attention", "flash", "fmha", "sdpa",
                          # cuDNN's attention backward, beside its sdpa kernel
                          "compute_dot_do_o", "convert_dq_to_16bits"), ()),
    # host ops: aten::conv2d, aten::convolution, aten::mkldnn_convolution, aten::cudnn_convolution,
    # aten::convolution_backward, ConvolutionBackward0, aten::slow_conv*, aten::conv_depthwise2d;
    # kernels: cuDNN's (implicit_convolve_sgemm, winograd, the xmma/cutlass fprop, dgrad
    # and wgrad implicit gemms, scudnn, its layout transposes), PyTorch's own (im2col,
    # conv_depthwise2d, conv2d_grouped_direct). Not bare "conv": "convert" is no convolution.
    (Category.CONVOLUTION, ("convolution", "aten::conv", "aten::slow_conv", "aten::thnn_conv", "conv_depthwise",
                            "conv1d", "conv2d", "conv3d", "convolve", "winograd", "wgrad", "dgrad", "fprop",
                            "cudnn", "im2col", "col2im", "vol2col"),
     ("bn_fw", "bn_bw", "batch_norm", "batchnorm", "rnn", "lstm")),
    (Category.MATMUL, ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::matmul",
                       "aten::linear", "aten::_addmm_activation", "aten::einsum", "mkldnn_matmul",
                       "mmbackward", "bmmbackward", "linearbackward",
                       "gemm", "gemv", "nvjet", "cutlass", "cublas", "xmma",
                       "sm90_", "sm80_", "sm86_", "sm89_", "sm100_", "ampere_", "hopper_", "volta_", "turing_"),
     ()),
)


def category_of(name: str) -> Category | None:
    """What an event named ``name`` is; None: its name does not say (look inside it)."""
    lowered = name.lower()
    for category, fragments, unless in _RULES:
        if any(f in lowered for f in fragments) and not any(f in lowered for f in unless):
            return category
    return None


@dataclasses.dataclass(frozen=True)
class StepShares:
    """Where a window's time went: milliseconds per category (they add up to
    ``window_ms``), over ``steps`` steps; ``source``: CPU ops or GPU kernels."""

    window_ms: float
    steps: int
    ms: Mapping[Category, float]
    source: str

    @property
    def step_ms(self) -> float:
        return self.window_ms / self.steps if self.steps else 0.0

    @property
    def shares(self) -> dict[Category, float]:
        return {c: (self.ms.get(c, 0.0) / self.window_ms if self.window_ms > 0 else 0.0) for c in Category}

    def to_json(self, *, device: str, measured_step_ms: float | None = None) -> JsonObject:
        out: JsonObject = {"step_ms": round(self.step_ms, 4), "steps": self.steps, "device": device,
                               "source": self.source,
                               "shares": {c.value: round(s, 4) for c, s in self.shares.items()}}
        if measured_step_ms is not None:
            out["measured_step_ms"] = round(measured_step_ms, 4)
        return out


@dataclasses.dataclass
class _Node:
    event: ProfilerEvent
    children: list[_Node] = dataclasses.field(default_factory=list)


def _nest(events: Sequence[ProfilerEvent]) -> list[_Node]:
    """Events of one thread as the trees their time ranges make (a child lies inside its
    parent); the roots in time order."""
    roots: list[_Node] = []
    stack: list[_Node] = []
    for e in sorted(events, key=lambda e: (e.start, -e.duration)):
        while stack and e.start >= stack[-1].event.end:
            stack.pop()
        node = _Node(e)
        (stack[-1].children if stack else roots).append(node)
        stack.append(node)
    return roots


def _walk(node: _Node, ms: dict[Category, float], *, end: float, container: Category) -> None:
    """Add ``node``'s time (clipped at ``end``) to ``ms``: whole where its name says what it
    is, else its children's and its own time as ``container``."""
    e = node.event
    span = max(0.0, min(e.end, end) - e.start)
    named = category_of(e.name)
    if named is not None or not node.children:
        ms[named or Category.OTHER] += span
        return
    inner = 0.0
    stop = min(e.end, end)
    for child in node.children:
        _walk(child, ms, end=stop, container=Category.OTHER)
        inner += max(0.0, min(child.event.end, stop) - child.event.start)
    ms[container] += max(0.0, span - inner)


def _window(events: Sequence[ProfilerEvent]) -> ProfilerEvent:
    windows = [e for e in events if e.name == WINDOW and e.kind == ProfilerEventKind.CPU]
    if not windows:
        raise ValueError(f"no {WINDOW} range among the events: nothing to divide")
    return max(windows, key=lambda e: e.duration)


def _cpu_shares(events: Sequence[ProfilerEvent], window: ProfilerEvent) -> dict[Category, float]:
    inside = [e for e in events if e.kind == ProfilerEventKind.CPU and e.thread == window.thread and e is not window
              and e.start >= window.start and e.start < window.end]
    ms = {c: 0.0 for c in Category}
    root = _Node(window, _nest(inside))
    for node in root.children:
        if node.event.name == STEP:
            # a step's own time is Python between its ops: nothing runs
            _walk(node, ms, end=window.end, container=Category.IDLE)
        else:
            _walk(node, ms, end=window.end, container=Category.OTHER)
    covered = sum(ms.values())
    ms[Category.IDLE] += max(0.0, window.duration - covered)
    return ms


def _overlap(start: float, end: float, ranges: Sequence[tuple[float, float]]) -> float:
    return sum(max(0.0, min(end, b) - max(start, a)) for a, b in ranges)


def _kernel_shares(events: Sequence[ProfilerEvent], window: ProfilerEvent) -> dict[Category, float]:
    kernels = sorted((e for e in events if e.kind == ProfilerEventKind.KERNEL and e.end > window.start
                      and e.start < window.end), key=lambda e: e.start)
    waits = sorted((e.start, e.end) for e in events if e.kind == ProfilerEventKind.CPU and e.name == DATA_WAIT)
    optimizer = [(e.start, e.end) for e in events
                 if e.kind == ProfilerEventKind.ANNOTATION and category_of(e.name) == Category.OPTIMIZER]
    ms = {c: 0.0 for c in Category}
    gaps: list[tuple[float, float]] = []
    covered_until = window.start
    for k in kernels:
        start, end = max(k.start, covered_until), min(k.end, window.end)
        if k.start > covered_until:
            gaps.append((covered_until, k.start))
        if end > start:
            category = category_of(k.name)
            if category is None and any(a <= (k.start + k.end) / 2 < b for a, b in optimizer):
                category = Category.OPTIMIZER
            ms[category if category not in (None, Category.DATA_WAIT) else Category.OTHER] += end - start
        covered_until = max(covered_until, end)
    if covered_until < window.end:
        gaps.append((covered_until, window.end))
    for a, b in gaps:
        waiting = min(b - a, _overlap(a, b, waits))
        ms[Category.DATA_WAIT] += waiting
        ms[Category.IDLE] += (b - a) - waiting
    return ms


def step_shares(events: Iterable[ProfilerEvent]) -> StepShares:
    """Where the window's time went (see the module's text): by GPU kernels where the
    events hold any, else by CPU ops. Raises ValueError without an ``autotune.window``."""
    events = list(events)
    window = _window(events)
    steps = sum(1 for e in events if e.name == STEP and e.kind == ProfilerEventKind.CPU
                and window.start <= e.start < window.end)
    on_device = any(e.kind == ProfilerEventKind.KERNEL for e in events)
    ms = _kernel_shares(events, window) if on_device else _cpu_shares(events, window)
    return StepShares(window_ms=window.duration / 1000.0, steps=steps,
                      ms={c: v / 1000.0 for c, v in ms.items()},
                      source="gpu kernels" if on_device else "cpu ops")


def table_lines(profile: Mapping[str, Any]) -> list[str]:
    """A profile as ``StepShares.to_json`` wrote it, as lines for the console."""
    step_ms = float(profile["step_ms"])
    lines = [f"where the step goes ({profile['steps']} steps of {step_ms:.2f} ms, {profile['source']}):"]
    for category in Category:
        share = float(profile["shares"].get(category.value, 0.0))
        lines.append(f"  {share:6.1%}  {share * step_ms:8.2f} ms  {category.label}")
    return lines
