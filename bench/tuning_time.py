"""How long a whole `autotune run` takes, two source trees (two commits) alternating on one
machine in one session: absolute times drift on a shared machine, ratios of runs taken
minutes apart hold better.

    git worktree add /tmp/old cc04245
    python bench/tuning_time.py --trees /tmp/old . --model examples/fashion_cnn.py --trials 12 --repeats 2

Each run is `python -m autotune run MODEL --trials N --json` from that tree (PYTHONPATH),
into a fresh output folder, the trees' order alternating per repeat. Printed per run: wall
time, the verified speedup and its interval; then per tree the median wall time, and each
tree's median over the first tree's.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def run(tree: Path, model: Path, *, trials: int, extra: list[str], out: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    argv = [sys.executable, "-m", "autotune", "run", str(model), "--trials", str(trials), "--out", str(out),
            "--json", "--quiet", *extra]
    started = time.monotonic()
    # Not from a source tree: `python -m` puts the working directory first on sys.path,
    # ahead of PYTHONPATH, and the run would import that tree's autotune instead.
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, cwd=out.parent)
    wall = time.monotonic() - started
    try:
        doc = json.loads(proc.stdout)
    except json.JSONDecodeError:
        doc = {}
    speedup = doc.get("speedup") or {}
    config = doc.get("config") or {}
    return {"tree": str(tree), "wall_s": round(wall, 1), "exit": proc.returncode,
            "speedup": speedup.get("median"), "interval": [speedup.get("ci_low"), speedup.get("ci_high")],
            "config": {k: v for k, v in config.items() if v not in (None, False, 0, "off", "none", "default")},
            "stderr_tail": proc.stderr[-600:] if proc.returncode not in (0, 3) else ""}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trees", nargs="+", type=Path, required=True)
    p.add_argument("--model", type=Path, default=Path("examples/fashion_cnn.py"))
    p.add_argument("--trials", type=int, default=12)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--json-out", type=Path, default=Path("bench-out/tuning_time.json"))
    p.add_argument("extra", nargs="*", help="more options for autotune run (after --)")
    args = p.parse_args()
    trees = [t.resolve() for t in args.trees]
    model = args.model.resolve()
    runs: list[dict] = []
    work = Path(tempfile.mkdtemp(prefix="tuning-time-"))
    work.mkdir(parents=True, exist_ok=True)
    for r in range(args.repeats):
        order = trees if r % 2 == 0 else list(reversed(trees))
        for tree in order:
            result = run(tree, model, trials=args.trials, extra=args.extra,
                         out=work / f"{r}-{trees.index(tree)}")
            runs.append(result)
            print(json.dumps(result), flush=True)
    walls = {str(t): [x["wall_s"] for x in runs if x["tree"] == str(t)] for t in trees}
    first = statistics.median(walls[str(trees[0])])
    summary = {t: {"median_wall_s": statistics.median(w), "over_first": round(statistics.median(w) / first, 3)}
               for t, w in walls.items()}
    print(json.dumps(summary, indent=1))
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({"runs": runs, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
