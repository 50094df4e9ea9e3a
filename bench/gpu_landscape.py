"""Record a workload's GPU landscape: a design of configurations measured on this machine,
each with its throughput and spread, peak device memory, process setup and compile time,
saved as JSON that the tests' simulated GPU node replays (tests/landscapes.py reads it;
tests/fixtures/landscapes/ keeps them, one per workload and device).

    python bench/gpu_landscape.py examples/fashion_cnn.py --out tests/fixtures/landscapes/fashion_cnn_h100.json

The design, in order, until --budget-s is spent (what was measured is always written):
1. the batch ladder in one warm process (the batch is not a process knob): bf16 (else fp32)
   at the user's batch, twice it... until out of memory, two steps without a 5% rise, the
   data set or 16,384;
2. batch x precision x workers, uncompiled, at the user's batch, the ladder's fastest and
   the batch between (in log2);
3. each compile mode at the best point so far (a fresh process each: a compile's cost);
4. one at a time at the best point: cuDNN's benchmark, channels_last, the fused step,
   expandable segments (those the workload's space offers).
The best point so far and the user's configuration are profiled (where the step goes).
Windows are short (GPU windows agree within a few percent): 0.5 s x 3 by default.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import TrialConfig
from autotune.options import RunOptions
from autotune.probes import probe_machine
from autotune.sections import SearchOptions
from autotune.task import load_task
from autotune.task_space import build_task_space
from autotune.trials.protocol import Measurement
from autotune.trials.runner import TrialRunner

FLAT = 0.05
MOST_BATCH = 16_384


def commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


class Recorder:
    def __init__(self, runner: TrialRunner, *, budget_s: float) -> None:
        self.runner, self.ends_at = runner, time.monotonic() + budget_s
        self.points: list[dict] = []
        self.seen: dict[TrialConfig, dict] = {}

    def left(self) -> bool:
        return time.monotonic() < self.ends_at

    def measure(self, cfg: TrialConfig, knobs: dict) -> dict | None:
        if cfg in self.seen or not self.left():
            return self.seen.get(cfg)
        began = time.monotonic()
        result = self.runner.run(cfg, name=f"point-{len(self.points):03d}")
        summary = result.summary()
        point: dict = {"config": knobs, "wall_s": round(time.monotonic() - began, 2),
                       "warm": bool(result.setup and result.setup.warm),
                       "setup_s": (result.phases or {}).get("start_import_s", 0.0) + (result.phases or {}).get(
                           "setup_s", 0.0)}
        if result.status == "ok" and result.value:
            point.update(samples_per_s=round(float(result.value), 2),
                         spread=round(float(result.iqr or 0.0) / float(result.value), 4),
                         peak_mb=summary.get("cuda_peak_mb") or summary.get("rank_peak_mb"),
                         compile_s=result.one_time_s if cfg.compile != "off" else None)
        else:
            point.update(samples_per_s=None, failure=str(result.failure or result.status),
                         message=(result.message or "")[-300:])
        self.points.append(point)
        self.seen[cfg] = point
        print(f"{cfg.short()}: {point.get('samples_per_s') or point.get('failure')}", flush=True)
        return point

    def profile(self, cfg: TrialConfig) -> None:
        if not self.left():
            return
        result = self.runner.run(cfg, name=f"profile-{len(self.points):03d}", profile=True)
        if result.step_profile is not None and cfg in self.seen:
            self.seen[cfg]["shares"] = dict(result.step_profile.shares)

    def best(self) -> tuple[TrialConfig, dict] | None:
        ran = [(c, p) for c, p in self.seen.items() if p.get("samples_per_s")]
        return max(ran, key=lambda cp: cp[1]["samples_per_s"]) if ran else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("workload", type=Path)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--budget-s", type=float, default=120.0)
    p.add_argument("--window", type=float, default=0.5)
    p.add_argument("--windows", type=int, default=3)
    args = p.parse_args()
    started, wall = datetime.datetime.now(datetime.timezone.utc), time.monotonic()
    machine = probe_machine()
    task = load_task(args.workload)
    space = build_task_space(task, machine, SearchOptions.of(RunOptions(), task=task))
    base = space.baseline
    choices = space.choices
    gpu = base.device == "cuda"
    with tempfile.TemporaryDirectory(prefix="landscape-") as tmp:
        runner = TrialRunner(model_file=task.path, machine=machine, workdir=Path(tmp),
                             measurement=Measurement(window_s=args.window, windows=args.windows),
                             compile_cache=Path(tmp) / "compile-cache")
        rec = Recorder(runner, budget_s=args.budget_s)
        try:
            record(rec, task=task, base=base, choices=choices, gpu=gpu)
        finally:
            runner.close()
    gpus = machine.gpus
    fresh = [pt["setup_s"] for pt in rec.points if not pt["warm"] and pt.get("samples_per_s")]
    compiles = {str(pt["config"].get("compile")): pt["compile_s"] for pt in rec.points if pt.get("compile_s")}
    doc = {
        "workload": str(args.workload.resolve().relative_to(ROOT)) if args.workload.resolve().is_relative_to(ROOT)
        else str(args.workload),
        "recorded": True, "source": f"measured by bench/gpu_landscape.py in {time.monotonic() - wall:.0f} s",
        "device": gpus[0].name if gpus else f"cpu ({machine.cpu.model})",
        "memory_mb": ((gpus[0].memory_bytes or 0) if gpus else (machine.memory.total_bytes or 0)) / 2**20,
        "driver": dict(machine.driver) or None,
        "torch": machine.torch.version, "cuda": machine.torch.cuda,
        "host_cores": machine.cpu.usable_cores, "commit": commit(), "date": started.isoformat(timespec="seconds"),
        "user_batch": task.batch_size, "budget_s": args.budget_s, "window_s": args.window, "windows": args.windows,
        "costs": {"setup_s": round(sorted(fresh)[len(fresh) // 2], 2) if fresh else None, "warmup_s": None,
                  "compile_s": compiles},
        "points": rec.points,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"wrote {args.out}: {len(rec.points)} points")
    return 0


def record(rec: Recorder, *, task, base: TrialConfig, choices: dict, gpu: bool) -> None:
    precisions = [p for p in ("fp32", "tf32", "bf16") if p in choices.get("precision", ["fp32"])]
    top_precision = "bf16" if "bf16" in precisions else "fp32"
    workers = choices.get("num_workers", [0])
    cores_workers = max(workers)
    # 1. the ladder, one warm process
    start = base.replace(precision=top_precision)
    batch, rates, most = task.batch_size, [], min(MOST_BATCH, task.dataset_len or MOST_BATCH)
    while batch <= most and rec.left():
        point = rec.measure(start.replace(batch_size=batch), {"batch_size": batch, "precision": top_precision})
        if point is None or not point.get("samples_per_s"):
            break
        rates.append((batch, point["samples_per_s"]))
        best = max(r for _, r in rates)
        if len(rates) >= 3 and max(r for _, r in rates[-2:]) < best * (1 + FLAT) and rates[-3][1] == best:
            break
        batch *= 2
    fastest = max(rates, key=lambda r: r[1])[0] if rates else task.batch_size
    between = 2 ** round((math.log2(task.batch_size) + math.log2(fastest)) / 2)
    # 2. batch x precision x workers, uncompiled
    for b in dict.fromkeys([fastest, task.batch_size, between]):
        for prec in precisions:
            for w in dict.fromkeys([0, 4 if 4 in workers else workers[-1], cores_workers]):
                rec.measure(base.replace(batch_size=b, precision=prec, num_workers=w, pin_memory=gpu),
                            {"batch_size": b, "precision": prec, "num_workers": w, "pin_memory": gpu})
    found = rec.best()
    if found is None:
        return
    rec.profile(found[0])
    rec.profile(base)
    # 3. compile modes at the best point
    for mode in choices.get("compile", ["off"])[1:]:
        cfg, knobs = found
        rec.measure(cfg.replace(compile=mode), {**knobs["config"], "compile": mode})
    cfg, knobs = rec.best() or found
    # 4. one knob at a time at the best point
    for knob, value in (("cudnn_benchmark", True), ("channels_last", True), ("optimizer_step", "fused"),
                        ("expandable_segments", True)):
        if value in choices.get(knob, []):
            rec.measure(cfg.replace(**{knob: value}), {**knobs["config"], knob: value})


if __name__ == "__main__":
    raise SystemExit(main())
