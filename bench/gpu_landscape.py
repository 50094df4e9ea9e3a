"""Record a workload's GPU landscape: a design of configurations measured on this machine with
autotune's own trial runner, each with its throughput and spread, peak memory, process setup
and compile time, saved as JSON that the tests' simulated GPU node replays (tests/landscape.py
reads it and says what each key means; tests/fixtures/landscapes/ keeps them).

    python bench/gpu_landscape.py examples/fashion_cnn.py --out tests/fixtures/landscapes/fashion_cnn_h100.json
    python bench/gpu_landscape.py tests/models/tiny_cnn.py --out /tmp/tiny.json --budget-s 25 --device cpu

The design, in order, until --budget-s is spent (counted from the first point: the machine's
probe and the model file's check come before, about ten seconds):
1. the batch ladder, in one warm process (the batch is not a process knob): the user's batch,
   twice it, four times... until out of memory, two doublings without a 5% rise, or 4096 (or
   the data set's length). On CUDA in bf16 (else tf32, fp32) with 4 workers and pinned memory,
   so that its knee is the GPU's and not the data loader's; on a CPU the user's configuration
   on tcmalloc (a warm process on glibc's allocator is not comparable: ``process_key``);
2. the user's configuration, then batch x precision (fp32, tf32, bf16 on CUDA; fp32 and bf16 on a
   CPU, those the space offers) x workers (0, 4, the cores per GPU; on CUDA memory pinned),
   uncompiled and warm, at the ladder's fastest batch, the user's and the one between (in
   log2): the fastest batch first;
3. the user's configuration and the fastest point so far profiled (where the step goes);
4. each compile mode the space offers, at the fastest point, then at the user's batch (on a
   GPU compiles are launch-bound there): each a fresh process and tens of seconds, so only as
   many as the budget left affords;
5. one at a time at the fastest point: cuDNN's benchmark, channels_last, the fused optimizer
   step, expandable segments, unpinned memory (those the workload's space offers);
6. what phase 2 had no time for.
A point (but the first) is not started when what it is expected to cost exceeds what is left
of its phase's share of the budget (phase 1 55% of it once it has two points, phase 2 70%,
phase 3 72%, phase 4 88%), and a started
one is cut at the end of the budget (plus a grace); what was measured is written after every
point, and at the end whatever happened. Windows are short (0.5 s x 3 by default: GPU windows
agree within a few percent).
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import TrialConfig
from autotune.errors import ContractError, UsageError
from autotune.harness import make_runner
from autotune.options import RunOptions
from autotune.probes import Machine, probe_machine
from autotune.runtime.knobs import Allocator, CompileMode, Device, OptimizerStep, Precision
from autotune.search.task_space import build_task_space
from autotune.sections import MeasureOptions, SearchOptions
from autotune.space import Space
from autotune.task import Task, load_task
from autotune.trials.result import TrialResult
from autotune.trials.runner import TrialRunner, process_key

FORMAT = 1
MOST_BATCH = 4096
FLAT = 0.05  # a doubling that adds less than this is flat; two flat ones end the ladder
GRACE_S = 15.0  # a point started within the budget may run this far past it, then it is cut
# What a point is expected to cost before one like it was measured, in seconds
GUESS_WARM_S, GUESS_FRESH_S = 4.0, 12.0
GUESS_COMPILE_S = {Device.CUDA: 45.0, Device.CPU: 40.0}


def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def dump_landscape(doc: Mapping[str, Any]) -> str:
    """A landscape as its files hold it: the header indented, one point a line."""
    header = {k: v for k, v in doc.items() if k != "points"}
    text = json.dumps(header, indent=1, default=str)[:-2]  # without the closing "\n}"
    points = ",\n".join("  " + json.dumps(p, default=str) for p in doc.get("points", []))
    return f"{text},\n \"points\": [\n{points}\n ]\n}}\n"


def write_landscape(path: Path, doc: Mapping[str, Any]) -> None:
    """Write ``doc`` to ``path`` whole or not at all (a cut run leaves the last one whole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dump_landscape(doc))
    os.replace(tmp, path)


def point_of(cfg: TrialConfig, result: TrialResult, *, phase: str, wall_s: float) -> dict[str, Any]:
    """What a landscape keeps of one measured configuration (tests/landscape.py reads it)."""
    summary = result.summary()
    phases = result.phases or {}
    warm = bool(result.setup is not None and result.setup.warm)
    point: dict[str, Any] = {
        "config": cfg.to_dict(), "phase": phase, "warm": warm,
        # the process's start and imports, and the configuration's setup: a fresh process's
        # whole setup; about 0 in a warm one
        "setup_s": round(phases.get("start_import_s", 0.0) + phases.get("setup_s", 0.0), 3),
        "wall_s": round(wall_s, 2),
        "warmup_s": round(phases.get("warmup_s", 0.0), 3),
    }
    peak: Any = summary.get("cuda_peak_mb") if cfg.device == Device.CUDA else None
    if peak is None:
        peak = summary.get("rank_peak_mb") or summary.get("peak_rss_mb") or None
    if result.status == "ok" and result.value:
        point.update(samples_per_s=round(float(result.value), 2),
                     spread=round(float(result.iqr or 0.0) / float(result.value), 4),
                     peak_mb=None if peak is None else round(float(peak), 1),
                     compile_s=None if cfg.compile == CompileMode.OFF or result.one_time_s is None
                     else round(result.one_time_s, 2),
                     values=[round(v, 2) for v in result.values])
    else:
        point.update(samples_per_s=None, failure=str(result.failure or result.status),
                     message=(result.message or "")[-300:],
                     peak_mb=None if peak is None else round(float(peak), 1))
    return point


class Recorder:
    """Measures the design's points with ``runner`` until ``budget_s`` from ``began`` is spent,
    keeping each in ``points`` (and writing them, with ``header``, to ``out``)."""

    def __init__(self, runner: TrialRunner, *, budget_s: float, began: float, out: Path,
                 header: dict[str, Any], device: Device) -> None:
        self.runner, self.budget_s, self.began, self.out = runner, budget_s, began, out
        self.header, self.device = header, device
        self.points: list[dict[str, Any]] = []
        self.seen: dict[TrialConfig, dict[str, Any]] = {}
        self.cut: list[str] = []  # points cut at the budget's end, not kept
        self.skipped = 0  # points the budget left no room for
        self.costs: dict[str, list[float]] = {"warm": [], "fresh": [], "compile": []}
        self.idle_key: str | None = None  # the warm process's, after the last point

    # --- time ---------------------------------------------------------------------------

    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def expected_s(self, cfg: TrialConfig) -> float:
        """What measuring ``cfg`` is expected to take: like the points measured so far."""
        def typical(kind: str, guess: float) -> float:
            return statistics.median(self.costs[kind]) if self.costs[kind] else guess
        key = process_key(cfg)
        if key is not None and key == self.idle_key:
            return typical("warm", GUESS_WARM_S)
        fresh = typical("fresh", GUESS_FRESH_S)
        if cfg.compile != CompileMode.OFF:
            return fresh + typical("compile", GUESS_COMPILE_S[self.device])
        return fresh

    # --- points -------------------------------------------------------------------------

    def measure(self, cfg: TrialConfig, *, phase: str, until: float = 1.0) -> dict[str, Any] | None:
        """Measure ``cfg`` (once: a repeat returns the first measurement) where it is expected
        to end before ``until`` x the budget; None where it is not measured."""
        if cfg in self.seen:
            return self.seen[cfg]
        if self.left() <= 0 or self.points and self.elapsed() + self.expected_s(cfg) > until * self.budget_s:
            self.skipped += 1
            return None
        began = time.monotonic()
        limit = max(10.0, self.left() + GRACE_S)
        result = self.runner.run(cfg, name=f"point-{len(self.points):03d}", timeout_s=limit)
        wall = time.monotonic() - began
        key = process_key(cfg)
        self.idle_key = key if key is not None and result.status == "ok" else None
        if result.failure == "timeout" and self.left() <= 0:
            self.cut.append(cfg.short())  # the budget's end, not the configuration's failure
            print(f"  cut at the budget's end: {cfg.short()}", flush=True)
            return None
        point = point_of(cfg, result, phase=phase, wall_s=wall)
        if result.status == "ok":
            if point["warm"]:
                self.costs["warm"].append(wall)
            else:
                self.costs["fresh"].append(wall - (point.get("compile_s") or 0.0))
                if point.get("compile_s"):
                    self.costs["compile"].append(point["compile_s"])
        self.points.append(point)
        self.seen[cfg] = point
        rate = point.get("samples_per_s")
        what = f"{rate:,.0f} samples/s" if rate else point.get("failure")
        where = "warm" if point["warm"] else f"fresh, setup {point['setup_s']:.1f} s"
        print(f"[{self.elapsed():6.1f} s] {phase:8s} {cfg.short()}: {what} ({where})", flush=True)
        self.write()
        return point

    def profile(self, cfg: TrialConfig, *, until: float) -> None:
        """Where ``cfg``'s step goes (a profiled run), kept as its point's ``shares``."""
        point = self.seen.get(cfg)
        if point is None or not point.get("samples_per_s") or "shares" in point:
            return
        if self.elapsed() + self.expected_s(cfg) > until * self.budget_s:
            return
        result = self.runner.run(cfg, name=f"profile-{len(self.points):03d}", profile=True,
                                 timeout_s=max(10.0, self.left() + GRACE_S))
        key = process_key(cfg)
        self.idle_key = key if key is not None and result.status == "ok" else None
        if result.step_profile is not None:
            point["shares"] = {k: round(float(v), 4) for k, v in result.step_profile.shares.items()}
            self.write()

    def best(self, *, compiled: bool = True) -> TrialConfig | None:
        ran = [(c, p) for c, p in self.seen.items()
               if p.get("samples_per_s") and (compiled or c.compile == CompileMode.OFF)]
        return max(ran, key=lambda cp: cp[1]["samples_per_s"])[0] if ran else None

    def document(self) -> dict[str, Any]:
        fresh = [p["setup_s"] for p in self.points if not p["warm"] and p.get("samples_per_s")]
        warmups = [p["warmup_s"] for p in self.points if p.get("samples_per_s") and p["config"]["compile"] == "off"]
        modes: dict[str, list[float]] = {}
        for p in self.points:
            if p.get("compile_s"):
                modes.setdefault(str(p["config"]["compile"]), []).append(p["compile_s"])
        return {**self.header, "took_s": round(float(self.header.get("check_s") or 0.0) + self.elapsed(), 1),
                "measured_s": round(self.elapsed(), 1),
                "skipped": self.skipped, "cut": self.cut,
                "costs": {"setup_s": round(statistics.median(fresh), 2) if fresh else None,
                          "warmup_s": round(statistics.median(warmups), 2) if warmups else None,
                          "compile_s": {m: round(statistics.median(v), 2) for m, v in modes.items()},
                          "recompile_s": None},
                "points": self.points}

    def write(self) -> None:
        write_landscape(self.out, self.document())


# --- the design --------------------------------------------------------------------------------


def offered(space: Space, knob: str, values: Iterable[Any]) -> list[Any]:
    """Those of ``values`` the space offers for ``knob``, in the order given."""
    have = space.choices.get(knob, [])
    return [v for v in values if v in have]


def workers_of(space: Space, machine: Machine, device: Device) -> list[int]:
    """0, 4 and the cores per GPU (per rank on a CPU), or the nearest the space offers below."""
    have = sorted(space.choices.get("num_workers", [0]))
    cores = int(machine.cpu.usable_cores or 1)
    per_gpu = cores // max(1, len(machine.gpus)) if device == Device.CUDA else cores
    picks = []
    for want in (0, 4, per_gpu):
        below = [w for w in have if w <= want]
        if below:
            picks.append(below[-1])
    return list(dict.fromkeys(picks))


def ladder(rec: Recorder, start: TrialConfig, *, most: int) -> list[tuple[int, float]]:
    """The batch ladder from ``start``'s batch: (batch, samples/s) of the points that ran."""
    rates: list[tuple[int, float]] = []
    batch, flat = start.batch_size, 0
    while batch <= most:
        point = rec.measure(start.replace(batch_size=batch), phase="ladder",
                            until=0.55 if len(rates) >= 2 else 1.0)
        if point is None or not point.get("samples_per_s"):
            break  # out of memory (kept as a point), another failure, or no time
        rate = float(point["samples_per_s"])
        flat = flat + 1 if rates and rate < max(r for _, r in rates) * (1 + FLAT) else 0
        rates.append((batch, rate))
        if flat >= 2:
            break
        batch *= 2
    return rates


def record(rec: Recorder, *, task: Task, space: Space, machine: Machine) -> None:
    base = space.baseline
    device = Device(base.device)
    gpu = device == Device.CUDA
    user = base
    if not gpu and Allocator.TCMALLOC in space.choices.get("allocator", []):
        user = base.replace(allocator=Allocator.TCMALLOC)  # a warm process keeps batches in order
    precisions = offered(space, "precision", (Precision.FP32, Precision.TF32, Precision.BF16) if gpu
                         else (Precision.FP32, Precision.BF16)) or [Precision.FP32]
    workers = workers_of(space, machine, device)
    most = min(MOST_BATCH, task.dataset_len or MOST_BATCH)

    # 1. the batch ladder, in one warm process
    start = user
    if gpu:
        four = max((w for w in workers if w <= 4), default=0)
        start = user.replace(precision=precisions[-1], num_workers=four, pin_memory=True,
                             persistent_workers=four > 0)
    rates = ladder(rec, start, most=most)
    fastest = max(rates, key=lambda r: r[1])[0] if rates else user.batch_size
    steps = round(math.log2(fastest / user.batch_size))
    between = user.batch_size * 2 ** round(steps / 2)
    batches = list(dict.fromkeys([fastest, user.batch_size, between]))

    # 2. batch x precision x workers, uncompiled, warm; the user's own configuration first
    def grid_point(batch: int, precision: Precision, w: int) -> TrialConfig:
        # on CUDA memory pinned throughout, with workers or without, so that the points differ in the
        # workers alone (the replay corrects by pairs that differ in one knob); unpinned, the
        # user's configuration and phase 5's
        return user.replace(batch_size=batch, precision=precision, num_workers=w, pin_memory=gpu,
                            persistent_workers=w > 0)

    grid = [user] + [grid_point(b, p, w) for b in batches for p in precisions for w in workers]
    late = []
    for cfg in grid:
        if rec.measure(cfg, phase="grid", until=0.7) is None and cfg not in rec.seen:
            late.append(cfg)

    # 3. where the step goes, for the user's configuration and the fastest so far
    for cfg in dict.fromkeys([user, rec.best() or user]):
        rec.profile(cfg, until=0.72)

    # 4. compile modes at the fastest point, then at the user's batch
    modes = [m for m in space.choices.get("compile", []) if m != CompileMode.OFF]
    order = [CompileMode.DEFAULT, CompileMode.REDUCE_OVERHEAD, CompileMode.MAX_AUTOTUNE_NO_CUDAGRAPHS]
    modes = sorted(modes, key=lambda m: order.index(m) if m in order else len(order))
    best = rec.best(compiled=False)
    if best is not None:
        for at in dict.fromkeys([best, best.replace(batch_size=user.batch_size)]):
            for mode in modes:
                rec.measure(at.replace(compile=mode), phase="compile", until=0.88)

    # 5. one knob at a time at the fastest point (the fastest uncompiled one where a compile
    # would not fit)
    knobs: list[tuple[str, Any]] = [("cudnn_benchmark", True), ("channels_last", True),
                                    ("optimizer_step", OptimizerStep.FUSED), ("expandable_segments", True)]
    top = rec.best()
    if top is not None:
        if top.pin_memory:
            knobs.append(("pin_memory", False))
        for knob, value in knobs:
            if knob != "pin_memory" and value not in space.choices.get(knob, []):
                continue
            variant = top.replace(**{knob: value})
            if rec.measure(variant, phase="knob") is None and variant not in rec.seen:
                plain = rec.best(compiled=False)
                if plain is not None and plain != top:
                    rec.measure(plain.replace(**{knob: value}), phase="knob")

    # 6. what the grid had no time for
    for cfg in late:
        rec.measure(cfg, phase="grid")


def header_of(args: argparse.Namespace, *, task: Task, machine: Machine, device: Device,
              started: datetime.datetime) -> dict[str, Any]:
    path = Path(args.workload).resolve()
    gpus = machine.gpus if device == Device.CUDA else []
    return {
        "format": FORMAT,
        "workload": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
        "recorded": True,
        "source": f"measured by bench/gpu_landscape.py on {gpus[0].name if gpus else 'a CPU'}",
        "device": gpus[0].name if gpus else f"cpu ({machine.cpu.model or 'unknown'})",
        "device_type": device.value,
        "memory_mb": round(((gpus[0].memory_bytes or 0) if gpus else (machine.memory.total_bytes or 0)) / 2**20, 1),
        "driver": machine.driver.get("version") if gpus else None,
        "torch": machine.torch.version, "cuda": machine.torch.cuda,
        "host_cores": machine.cpu.usable_cores, "commit": commit(),
        "date": started.isoformat(timespec="seconds"),
        "user_batch": task.batch_size, "budget_s": args.budget_s, "took_s": None,
        "window_s": args.window, "windows": args.windows,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", type=Path, help="a model file (autotune's contract)")
    p.add_argument("--out", type=Path, required=True, help="the landscape's JSON file")
    p.add_argument("--budget-s", type=float, default=120.0,
                   help="seconds of measuring, after the probe and the model file's check (default %(default)s)")
    p.add_argument("--device", choices=("cuda", "cpu"), default=None,
                   help="where the points run (default: CUDA where there is a GPU, else the CPU)")
    p.add_argument("--window", type=float, default=0.5, help="seconds a window (default %(default)s)")
    p.add_argument("--windows", type=int, default=3, help="windows a point (default %(default)s)")
    args = p.parse_args(argv)
    began = time.monotonic()
    started = datetime.datetime.now(datetime.timezone.utc)
    machine = probe_machine()
    if args.device == "cuda" and not machine.torch.cuda_available:
        print("gpu_landscape: --device cuda, but torch sees no CUDA device here", file=sys.stderr)
        return 2
    options = RunOptions(fixed={"device": args.device} if args.device else {}, window_s=args.window,
                         windows=args.windows)
    try:
        task = load_task(args.workload, device=args.device)
        space = build_task_space(task, machine, SearchOptions.of(options, task=task))
    except (ContractError, UsageError) as exc:
        print(f"gpu_landscape: {exc}", file=sys.stderr)
        return 2
    device = Device(space.baseline.device)
    header = header_of(args, task=task, machine=machine, device=device, started=started)
    header["check_s"] = round(time.monotonic() - began, 1)  # the probe and the model file's check
    with tempfile.TemporaryDirectory(prefix="landscape-") as tmp:
        runner = make_runner(task, machine, Path(tmp), MeasureOptions.of(options))
        rec = Recorder(runner, budget_s=args.budget_s, began=time.monotonic(), out=args.out, header=header,
                       device=device)
        try:
            record(rec, task=task, space=space, machine=machine)
        except KeyboardInterrupt:
            print("interrupted: writing what was measured", file=sys.stderr)
        finally:
            runner.close()
            rec.write()
    print(f"wrote {args.out}: {len(rec.points)} points in {rec.elapsed():.0f} s "
          f"({rec.skipped} skipped for the budget{f', {len(rec.cut)} cut' if rec.cut else ''})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
