"""Whether compiling pays depends on the run the user plans: the same model tuned for a
short run and for a long one, with every knob but compile pinned, and what each run picked
and printed as compiling's break-even (one-time cost over the time saved a step, both as
the search measured them).

    taskset -c 0 python bench/compile_break_even.py --model bench/workloads/fused_mlp.py --steps 100 100000

Each run is `python -m autotune run MODEL --train-steps N --json --quiet` plus the pins: one
process of one thread at batch 1024 (the model's), fp32, no DataLoader workers, glibc's
allocator, no core pinning; so compile is the one knob searched. Under `taskset -c 0` the
machine is one core, the baseline's too: compiled kernels gain most over eager ones on one
thread here. The runs go one after another, nothing else running.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PINS = ["--fix", "layout=1x1", "--fix", "batch_size=1024", "--fix", "num_workers=0", "--fix", "allocator=default",
        "--fix", "interop_threads=default", "--fix", "affinity=none", "--exact"]


def run(model: Path, steps: int, *, trials: int, extra: list[str], out: Path) -> dict:
    argv = [sys.executable, "-m", "autotune", "run", str(model), "--trials", str(trials), "--out", str(out),
            "--train-steps", str(steps), "--json", "--quiet", *PINS, *extra]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=out.parent,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    wall = time.monotonic() - started
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"steps": steps, "exit": proc.returncode, "stderr_tail": proc.stderr[-1500:]}
    plan = doc.get("plan") or {}
    return {"steps": steps, "exit": proc.returncode, "wall_s": round(wall, 1),
            "picked": doc["config"].get("compile"), "batch_size": doc["config"].get("batch_size"),
            "speedup": (doc.get("speedup") or {}).get("median"),
            "predicted_s": (plan.get("chosen") or {}).get("predicted_s"),
            "break_even": [{k: b[k] for k in ("config_short", "one_time_s", "saved_per_step_s", "steps")}
                           for b in plan.get("break_even", [])],
            "ranking": [(r["config"], r.get("planned_s"), r["samples_per_s"])
                        for r in (doc.get("search") or {}).get("ranking", [])[:6]]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=Path("bench/workloads/fused_mlp.py"))
    p.add_argument("--steps", type=int, nargs="+", default=[100, 100_000])
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--json-out", type=Path, default=Path("bench-out/compile_break_even.json"))
    p.add_argument("extra", nargs="*", help="more options for autotune run (after --)")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="break-even-"))
    runs = []
    for steps in args.steps:
        result = run(args.model.resolve(), steps, trials=args.trials, extra=args.extra, out=work / str(steps))
        runs.append(result)
        print(json.dumps(result), flush=True)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({"runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
