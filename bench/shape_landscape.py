"""Write the shaped GPU landscapes in tests/fixtures/landscapes/ (``*_shaped_h100.json``):
landscapes in the format ``bench/gpu_landscape.py`` records (tests/landscape.py reads them),
SHAPED by hand after what runs on an H200 showed, not measured. Each says so (``recorded``:
false, and its ``source``); a landscape that bench/gpu_landscape.py records on a GPU replaces
it. Deterministic: the same file every time.

    python bench/shape_landscape.py            # rewrites both fixtures
    python bench/shape_landscape.py --check    # prints the figures each shape is held to

A step here is a launch part (the CPU launching kernels and running Python, while the GPU
idles: what compiling shortens and CUDA graphs mostly remove), kernels (a fixed part and a part
per sample, by precision: what the precision, cuDNN's benchmark and compiling shorten), the
optimizer step (halved when fused) and the data: loaded in the training process without
workers (in series with the step), else by the workers ahead of it (only what they cannot hide
is waited for). Launch and kernels overlap (a soft maximum), so the throughput rises nearly in
proportion to the batch while the step is launch-bound and saturates past the knee. The shares
of each step are its profile.

The two shapes, after what the H200 runs showed:
- examples/fashion_cnn.py (batch 64, a small CNN with evaluate()): about 11,000 samples/s at
  the user's batch in fp32 without workers; rising with the batch to a knee near 4096; TF32
  about 1.3x and bf16 1.5x fp32 at large batches, little at 64; from batch 256 on, the step
  waits on data with 4 workers (13% at batch 256 in TF32), so 8 and 16 workers give 10-15%;
  cuDNN's benchmark 5% at large batches; compile default 10% at large batches, reduce-overhead
  25% at batches of 256 and below; cold compiles 30-45 s; a fresh process 8 s; a few hundred
  MB of memory;
- examples/tiny_gpt.py (batch 16, a two-layer GPT-2): launch-bound at small batches (85% idle
  at batch 32), so the throughput is nearly proportional to the batch up to about 512;
  reduce-overhead 2x at small batches, compile default 30% at large ones, bf16 1.3x at large
  batches; workers matter little (the data set is tensors in memory); out of memory beyond
  batch 4096 in fp32 (and TF32).
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu_landscape import FORMAT, write_landscape

from autotune.config import TrialConfig

OUT = ROOT / "tests" / "fixtures" / "landscapes"
PRECISIONS = ("fp32", "tf32", "bf16")
MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
H100_MB = 81_559.0  # what torch reports of an H100 80GB HBM3
SOFT = 4.0  # the soft maximum's exponent: launch and kernels overlap


def soft_max(a: float, b: float, p: float = SOFT) -> float:
    return float((a**p + b**p) ** (1.0 / p))


@dataclasses.dataclass(frozen=True)
class Knobs:
    batch: int
    precision: str = "fp32"
    compile: str = "off"
    workers: int = 0
    pin: bool = False
    cudnn: bool = False
    channels_last: bool = False
    fused: bool = False
    expandable: bool = False

    def config(self) -> dict[str, Any]:
        return TrialConfig.from_dict({
            "batch_size": self.batch, "device": "cuda", "backend": "nccl", "precision": self.precision,
            "compile": self.compile, "num_workers": self.workers, "pin_memory": self.pin,
            "persistent_workers": self.workers > 0, "cudnn_benchmark": self.cudnn,
            "channels_last": self.channels_last, "optimizer_step": "fused" if self.fused else "default",
            "expandable_segments": self.expandable}).to_dict()


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    workload: str
    user_batch: int
    batches: tuple[int, ...]  # the ladder: every power of two from the user's batch
    launch_ms: float  # per step, eager
    kernel_ms: float  # kernels' fixed part per step
    sample_us: dict[str, float]  # kernels per sample, by precision
    optimizer_ms: float
    main_us: float  # one sample loaded in the training process (no workers)
    worker_us: float  # one sample in a worker
    worker_batch_ms: float  # one batch in a worker: collate, its passage to the training process
    copy_us: float  # one sample's copy to the GPU from pinned memory (pageable: twice)
    fixed_mb: float
    sample_mb: dict[str, float]  # activations per sample: fp32 (and TF32), bf16
    kind: str  # what the kernels are: "convolution" or "matmul"
    # (launch, kernels) factors of each compile mode
    compiled: dict[str, tuple[float, float]]
    compile_s: dict[str, float]
    setup_s: float
    cudnn: float = 1.0  # the kernels' factor under cuDNN's benchmark (convolutions only)
    channels_last: float = 1.0  # the kernels' factor in channels_last, in bf16 (convolutions only)
    oom: tuple[int, ...] = ()  # batches recorded out of memory, in fp32 and TF32
    about: str = ""

    # --- one step ---------------------------------------------------------------------

    def parts(self, k: Knobs) -> dict[str, float]:
        """Milliseconds of one step of ``k``, by the profile's categories."""
        launch_f, kernel_f = self.compiled.get(k.compile, (1.0, 1.0))
        launch = self.launch_ms * launch_f
        kernels = (self.kernel_ms + k.batch * self.sample_us[k.precision] / 1000.0) * kernel_f
        if self.kind == "convolution":
            kernels *= (self.cudnn if k.cudnn else 1.0) * (self.channels_last if k.channels_last
                                                           and k.precision == "bf16" else 1.0)
        busy = soft_max(launch, kernels)
        optimizer = self.optimizer_ms * (0.5 if k.fused else 1.0)
        copy = k.batch * self.copy_us * (1.0 if k.pin else 2.0) / 1000.0
        gpu = busy + optimizer + copy
        if k.workers == 0:
            wait = k.batch * self.main_us / 1000.0  # loaded in series with the step
        else:
            feed = (self.worker_batch_ms + k.batch * self.worker_us / 1000.0) / k.workers
            wait = soft_max(gpu, feed, 8.0) - gpu  # what the workers cannot hide
        kinds = {"convolution": 0.75, "other": 0.25} if self.kind == "convolution" else {
            "matmul": 0.55, "attention": 0.15, "other": 0.30}
        return {"idle": busy - kernels + copy, **{c: kernels * s for c, s in kinds.items()}, "optimizer": optimizer,
                "data_wait": wait}

    def rate(self, k: Knobs) -> float:
        return 1000.0 * k.batch / sum(self.parts(k).values())

    def peak_mb(self, k: Knobs) -> float:
        per = self.sample_mb["bf16" if k.precision == "bf16" else "fp32"]
        return self.fixed_mb + k.batch * per * (0.97 if k.expandable else 1.0)

    # --- the design --------------------------------------------------------------------

    def design(self) -> list[tuple[str, Knobs]]:
        """The points, by phase, as bench/gpu_landscape.py would measure them given the time: the
        user's configuration; every ladder batch in each precision and in 0, 4 and 16 workers (memory
        pinned); more workers at a few batches; each compile mode at four batches in fp32 and bf16;
        each knob (unpinned memory too) at two batches and at the fastest compiled point."""
        top = self.batches[-1]
        out = [("grid", Knobs(self.user_batch))]  # the user's own configuration
        for b in self.batches:
            for p in PRECISIONS:
                for w in self.workers():
                    out.append(("ladder" if p == "bf16" and w == 4 else "grid", Knobs(b, p, "off", w, pin=True)))
        mid = self.batches[len(self.batches) // 2]
        for w in self.more_workers():
            for b in (self.batches[2], mid, top):
                for p in ("tf32", "bf16"):
                    out.append(("grid", Knobs(b, p, "off", w, pin=True)))
        fast = self.workers()[-1]
        at = sorted({self.batches[0], self.batches[2], self.batches[-3], top})
        for mode in MODES:
            for b in at:
                for p in ("fp32", "bf16"):
                    out.append(("compile", Knobs(b, p, mode, fast, pin=True)))
        variants = self.knob_variants()
        for b in (self.batches[2], top):
            plain = Knobs(b, "bf16", "off", fast, pin=True)
            for v in [*variants, {"pin": False}]:
                out.append(("knob", dataclasses.replace(plain, **v)))
        best = max((k for _, k in out if k.compile != "off"), key=self.rate)
        together = {name: value for v in variants for name, value in v.items() if name != "expandable"}
        for v in [*variants, together]:
            out.append(("knob", dataclasses.replace(best, **v)))
        for b in self.oom:
            for p in ("fp32", "tf32"):
                out.append(("ladder", Knobs(b, p, "off", 0)))
        return out

    def workers(self) -> tuple[int, ...]:
        return (0, 4, 16)

    def more_workers(self) -> tuple[int, ...]:
        return (8, 32) if self.kind == "convolution" else ()

    def knob_variants(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = [{"fused": True}, {"expandable": True}]
        if self.kind == "convolution":
            out = [{"cudnn": True}, {"channels_last": True}, *out]
        return out

    def landscape(self) -> dict[str, Any]:
        points: list[dict[str, Any]] = []
        seen: set[Knobs] = set()
        process: tuple[Any, ...] | None = None
        for phase, k in self.design():
            if k in seen:
                continue
            seen.add(k)
            # a warm process runs the uncompiled points that share its process knobs
            key = (k.cudnn, k.expandable) if k.compile == "off" else None
            warm = key is not None and key == process
            process = key
            point: dict[str, Any] = {"config": k.config(), "phase": phase, "warm": warm,
                                     "setup_s": 0.3 if warm else self.setup_s}
            if k.batch in self.oom and k.precision in ("fp32", "tf32"):
                point.update(samples_per_s=None, failure="out_of_memory",
                             message="CUDA out of memory (shaped)")
                process = None
            else:
                parts = self.parts(k)
                step = sum(parts.values())
                point.update(samples_per_s=round(self.rate(k), 1),
                             spread={"off": 0.03 if k.workers == 0 else 0.02}.get(k.compile, 0.015),
                             peak_mb=round(self.peak_mb(k), 1),
                             compile_s=self.compile_s[k.compile] if k.compile != "off" else None,
                             shares={c: round(v / step, 4) for c, v in parts.items()})
            points.append(point)
        return {
            "format": FORMAT, "workload": self.workload, "recorded": False,
            "source": (f"Shaped by hand after {self.about}; not measured. bench/shape_landscape.py writes it; "
                       "a landscape recorded on a GPU by bench/gpu_landscape.py replaces it."),
            "device": "NVIDIA H100 80GB HBM3 (shaped)", "device_type": "cuda", "memory_mb": H100_MB,
            "driver": None, "torch": None, "cuda": None, "host_cores": 32, "commit": None, "date": None,
            "user_batch": self.user_batch, "budget_s": None, "took_s": None, "window_s": 0.5, "windows": 3,
            "costs": {"setup_s": self.setup_s, "warmup_s": 2.0, "compile_s": dict(self.compile_s),
                      "recompile_s": 6.0},
            "points": points,
        }

    # --- what the shape is held to ---------------------------------------------------------

    def figures(self) -> dict[str, float]:
        top, u = self.batches[-1], self.user_batch
        fast = self.workers()[-1]
        r = self.rate

        def big(p: str, **kw: Any) -> Knobs:
            return Knobs(top, p, workers=fast, pin=True, **kw)

        shares = self.parts(Knobs(256, "tf32", workers=4, pin=True))
        step = sum(shares.values())
        return {
            "user's": r(Knobs(u)),
            "top/user's best uncompiled": r(big("fp32")) / r(Knobs(u, workers=fast, pin=True)),
            "top/half (fp32, knee)": r(big("fp32")) / r(dataclasses.replace(big("fp32"), batch=top // 2)),
            "512/256 (fp32)": r(Knobs(512, workers=fast, pin=True)) / r(Knobs(256, workers=fast, pin=True)),
            "tf32/fp32 top": r(big("tf32")) / r(big("fp32")),
            "bf16/fp32 top": r(big("bf16")) / r(big("fp32")),
            "bf16/fp32 user's": r(Knobs(u, "bf16")) / r(Knobs(u)),
            "idle share 256 tf32 4w": shares["idle"] / step,
            "idle share 32 tf32 4w": self.parts(Knobs(32, "tf32", workers=4, pin=True))["idle"]
            / sum(self.parts(Knobs(32, "tf32", workers=4, pin=True)).values()),
            "data wait 256 tf32 4w": shares["data_wait"] / step,
            "8w/4w 256 tf32": r(Knobs(256, "tf32", workers=8, pin=True)) / r(Knobs(256, "tf32", workers=4, pin=True)),
            "16w/4w 256 tf32": r(Knobs(256, "tf32", workers=16, pin=True)) / r(Knobs(256, "tf32", workers=4, pin=True)),
            "16w/4w top bf16": r(big("bf16")) / r(Knobs(top, "bf16", workers=4, pin=True)),
            "cudnn top bf16": r(big("bf16", cudnn=True)) / r(big("bf16")),
            "default top bf16": r(big("bf16", compile="default")) / r(big("bf16")),
            "reduce-overhead 256 bf16": r(Knobs(256, "bf16", "reduce-overhead", fast, pin=True))
            / r(Knobs(256, "bf16", workers=fast, pin=True)),
            "reduce-overhead user's bf16": r(Knobs(u, "bf16", "reduce-overhead", fast, pin=True))
            / r(Knobs(u, "bf16", workers=fast, pin=True)),
            "peak MB top fp32": self.peak_mb(big("fp32")),
        }


SHAPES = (
    Shape(name="fashion_cnn_shaped_h100", workload="examples/fashion_cnn.py", user_batch=64,
          batches=(64, 128, 256, 512, 1024, 2048, 4096),
          launch_ms=4.0, kernel_ms=0.3, sample_us={"fp32": 2.7, "tf32": 2.05, "bf16": 1.75}, optimizer_ms=0.4,
          main_us=20.0, worker_us=4.5, worker_batch_ms=18.2, copy_us=0.12,
          fixed_mb=90.0, sample_mb={"fp32": 0.1, "bf16": 0.06}, kind="convolution",
          compiled={"default": (0.88, 0.9), "reduce-overhead": (0.76, 0.97),
                    "max-autotune-no-cudagraphs": (0.88, 0.87)},
          compile_s={"default": 32.0, "reduce-overhead": 38.0, "max-autotune-no-cudagraphs": 45.0}, setup_s=8.0,
          cudnn=0.94, channels_last=0.97,
          about=("the README example (examples/fashion_cnn.py) on an H200: batch 256 in TF32 with 4 workers "
                 "verified 5.19x, its step idle 69% and waiting on data 13%; compiles of 30-45 s")),
    Shape(name="tiny_gpt_shaped_h100", workload="examples/tiny_gpt.py", user_batch=16,
          batches=(16, 32, 64, 128, 256, 512, 1024, 2048, 4096),
          launch_ms=9.5, kernel_ms=0.6, sample_us={"fp32": 9.0, "tf32": 7.9, "bf16": 6.9}, optimizer_ms=0.8,
          main_us=0.5, worker_us=1.0, worker_batch_ms=1.5, copy_us=0.05,
          fixed_mb=250.0, sample_mb={"fp32": 12.0, "bf16": 7.0}, kind="matmul",
          compiled={"default": (0.75, 0.76), "reduce-overhead": (0.44, 0.8),
                    "max-autotune-no-cudagraphs": (0.75, 0.72)},
          compile_s={"default": 40.0, "reduce-overhead": 48.0, "max-autotune-no-cudagraphs": 70.0}, setup_s=10.0,
          oom=(8192,),
          about=("a small GPT-2 on an H200: at batch 32 in TF32 its step idle 85% (launch-bound, 0.9% MFU); "
                 "the README example's compiles of 30-45 s")),
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--check", action="store_true", help="print each shape's figures, write nothing")
    args = parser.parse_args()
    for shape in SHAPES:
        if args.check:
            print(shape.name)
            for name, value in shape.figures().items():
                print(f"  {name:30s} {value:12.3f}")
            continue
        doc = shape.landscape()
        path = args.out / f"{shape.name}.json"
        write_landscape(path, doc)
        print(f"wrote {path}: {len(doc['points'])} points")


if __name__ == "__main__":
    main()
