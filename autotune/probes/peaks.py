"""The peak FLOP/s a configuration's achieved FLOP/s is a share of: on a known NVIDIA GPU
its datasheet's dense peak in the configuration's precision, elsewhere (an unknown GPU,
any CPU) the best of a few large square matmuls measured here, in that precision, with
the process's threads.

Dense means without 2:4 structured sparsity: NVIDIA's datasheets print the sparse
figure (twice the dense one) for tensor-core precisions, marked with an asterisk.
torch is imported in the functions that measure: the table is plain data.
"""
from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

from autotune.runtime.json_value import JsonObject
from autotune.runtime.knobs import Device

TERA = 1e12


@dataclasses.dataclass(frozen=True, kw_only=True)
class DevicePeaks:
    """One device's dense peaks, FLOP/s per precision (a precision it lacks is absent)."""

    label: str
    peaks: Mapping[str, float]


def _peaks(label: str, *, bf16: float | None = None, fp16: float | None = None, tf32: float | None = None,
           fp32: float, fp8: float | None = None) -> DevicePeaks:
    given = {"bf16": bf16, "fp16": fp16 if fp16 is not None else bf16, "tf32": tf32, "fp32": fp32, "fp8": fp8}
    return DevicePeaks(label=label, peaks={k: v * TERA for k, v in given.items() if v is not None})


# (what the GPU's name contains, lowercased; its peaks), most specific first: CUDA and
# NVML name an H100 SXM "NVIDIA H100 80GB HBM3", a PCIe one "NVIDIA H100 PCIe".
GPU_PEAKS: tuple[tuple[tuple[str, ...], DevicePeaks], ...] = (
    # NVIDIA H100 Tensor Core GPU datasheet (2023), SXM / PCIe / NVL columns; the tensor
    # figures there are with sparsity, halved here
    (("h100", "nvl"), _peaks("H100 NVL", bf16=835, tf32=418, fp32=60, fp8=1671)),
    (("h100", "pcie"), _peaks("H100 PCIe", bf16=756, tf32=378, fp32=51.2, fp8=1513)),
    (("h100",), _peaks("H100 SXM", bf16=989, tf32=494.7, fp32=66.9, fp8=1979)),
    # NVIDIA H200 Tensor Core GPU datasheet (2024), SXM: the H100 SXM's compute
    (("h200",), _peaks("H200", bf16=989, tf32=494.7, fp32=66.9, fp8=1979)),
    # NVIDIA A100 Tensor Core GPU datasheet (2021): SXM and PCIe alike
    (("a100",), _peaks("A100", bf16=312, tf32=156, fp32=19.5)),
    # NVIDIA L40S datasheet (2023)
    (("l40s",), _peaks("L40S", bf16=362, tf32=183, fp32=91.6, fp8=733)),
    # NVIDIA L4 Tensor Core GPU datasheet (2023)
    (("l4",), _peaks("L4", bf16=121, tf32=60, fp32=30.3, fp8=242)),
    # NVIDIA A10G: AWS's G5 instance page and NVIDIA's A10 datasheet (its A10G variant)
    (("a10g",), _peaks("A10G", bf16=70, tf32=35, fp32=31.2)),
    # NVIDIA V100 Tensor Core GPU datasheet (2020), SXM2 and PCIe columns: no bf16, no tf32
    (("v100", "pcie"), _peaks("V100 PCIe", fp16=112, fp32=14)),
    (("v100",), _peaks("V100 SXM2", fp16=125, fp32=15.7)),
    # NVIDIA Ada Lovelace architecture whitepaper (2023), GeForce RTX 4090: fp16/bf16
    # tensor with fp32 accumulate (what autocast runs), dense
    (("rtx 4090",), _peaks("RTX 4090", bf16=165.2, tf32=82.6, fp32=82.6)),
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Peak:
    """A peak in FLOP/s and where it comes from: ``table:H100 SXM bf16 dense`` or
    ``measured:cpu fp32 matmul, 2 threads``."""

    flop_per_s: float
    source: str

    def times(self, ranks: int, total: float | None = None) -> Peak:
        """The peak of ``ranks`` ranks: each rank's table peak times their number, or
        ``total`` where the ranks measured theirs side by side and added them up."""
        if ranks <= 1:
            return self
        value = total if total is not None else self.flop_per_s * ranks
        return Peak(flop_per_s=value, source=f"{self.source} x {ranks} ranks")

    def to_json(self) -> JsonObject:
        return {"peak_flop_per_s": self.flop_per_s, "peak_source": self.source}


def peak_precision(precision: str, *, device_type: str, native_half: bool = True) -> str:
    """The precision whose peak a configuration's FLOPs run at: fp32 is fp32 (on CUDA
    without TF32 matmuls, PyTorch's default), tf32 is tf32 on CUDA and fp32 on a CPU,
    bf16 and fp16 are themselves where the hardware runs them natively, fp32 on a CPU
    that converts them to fp32 to multiply."""
    if precision == "tf32":
        return "tf32" if device_type == Device.CUDA else "fp32"
    if precision in ("bf16", "fp16"):
        return precision if device_type == Device.CUDA or native_half else "fp32"
    return "fp32"


def mfu_peak(source: str) -> Peak | None:
    """The dense bf16 peak of the GPU a table peak (``source``, as ``Peak.source``) names:
    the figure MFU is quoted against whatever the precision (an fp32 baseline's share of
    its fp32 peak says how well it runs, not how far it is from what the GPU can do).
    None where the source is measured, or the GPU has no bf16."""
    kind, _, what = source.partition(":")
    ranks = 1
    if " x " in what and what.endswith(" ranks"):
        what, _, count = what.partition(" x ")
        ranks = int(count.split()[0])
    if kind != "table":
        return None
    for _, device in GPU_PEAKS:
        if what.startswith(device.label + " ") and "bf16" in device.peaks:
            return Peak(flop_per_s=device.peaks["bf16"], source=f"table:{device.label} bf16 dense").times(ranks)
    return None


def table_peak(gpu_name: str | None, precision: str) -> Peak | None:
    """A known GPU's dense datasheet peak in ``precision``; None for a GPU (or a precision
    of it) the table does not hold."""
    name = (gpu_name or "").lower()
    if " mig " in f" {name} ":
        return None  # a MIG instance has a share of the GPU's units, not its peak
    for words, device in GPU_PEAKS:
        if all(w in name for w in words):
            value = device.peaks.get(precision)
            if value is None:
                return None
            return Peak(flop_per_s=value, source=f"table:{device.label} {precision} dense")
    return None


def cpu_native_half(flags: set[str] | None = None) -> dict[str, bool]:
    """Whether this CPU multiplies bf16 and fp16 natively (AVX512-BF16/AMX-BF16,
    AVX512-FP16/AMX-FP16), from /proc/cpuinfo's flags or the ones given."""
    if flags is None:
        flags = set()
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith(("flags", "Features")):
                        flags = set(line.split(":", 1)[1].split())
                        break
        except OSError:
            pass
    return {"bf16": bool(flags & {"avx512_bf16", "amx_bf16"}),
            "fp16": bool(flags & {"avx512_fp16", "amx_fp16"})}


def measure_matmul(*, device: Any, dtype: Any, n: int, budget_s: float = 0.3, repeats: int = 5) -> float:
    """FLOP/s of the fastest of a few ``n`` x ``n`` matmuls on ``device`` (after one to warm
    up), stopping early once ``budget_s`` is spent. On CUDA each timing holds several
    matmuls so the launch does not count."""
    import torch

    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    cuda = torch.device(device).type == Device.CUDA
    per_timing = 8 if cuda else 1

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    torch.matmul(a, b)
    sync()
    best, started = float("inf"), time.perf_counter()
    for i in range(repeats):
        t0 = time.perf_counter()
        for _ in range(per_timing):
            torch.matmul(a, b)
        sync()
        best = min(best, (time.perf_counter() - t0) / per_timing)
        if i >= 1 and time.perf_counter() - started > budget_s:
            break
    return 2.0 * n**3 / best


def measured_peak(*, device: Any, precision: str) -> Peak:
    """The matmul peak measured here in ``precision`` (a ``peak_precision``), in a process
    whose precision flags and threads are the configuration's: on a CPU a matrix size
    that keeps it well under a second."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision, torch.float32)
    kind = torch.device(device).type
    if kind == Device.CUDA:
        # fp32 matmuls run as the process's flags say: the configuration set TF32 for
        # tf32 and left it off for fp32 (runtime.session.configure_precision)
        n = 8192 if dtype != torch.float32 else 4096
        value = measure_matmul(device=device, dtype=dtype, n=n)
        return Peak(flop_per_s=value, source=f"measured:{torch.cuda.get_device_name(device)} {precision} matmul")
    threads = torch.get_num_threads()
    n = 1024 if threads <= 8 else 2048
    value = measure_matmul(device=device, dtype=dtype, n=n)
    return Peak(flop_per_s=value, source=f"measured:cpu {precision} matmul, {threads} threads")


def device_peak(*, device_type: str, gpu_name: str | None, precision: str,
                measure: Callable[[str], Peak], native_half: bool = True, ranks: int = 1) -> Peak:
    """The peak of a configuration's ``precision`` on ``ranks`` ranks' devices: a known
    GPU's table peak times the ranks, else what ``measure`` (given the precision to
    measure in) finds for all of them."""
    wanted = peak_precision(precision, device_type=device_type, native_half=native_half)
    if device_type == Device.CUDA:
        known = table_peak(gpu_name, wanted)
        if known is not None:
            return known.times(ranks)
    return measure(wanted)
