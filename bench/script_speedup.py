"""Check a Trainer script's reported speedup by running the user's script itself: the
script as written (``run_tuned.py --as-written``: their script, their arguments, their
environment) against the emitted ``launch.sh`` (the same script with the tuned arguments and
environment), alternating, each alone, and compare with the interval the run printed.

    python bench/script_speedup.py autotune-out/hf_trainer --pairs 6 --seconds 10

Each run trains about --seconds of the user's Trainer (``--max-steps``, from the rates the
run measured) and saves nothing; its samples per second are timed after its first 3 steps
by the emitted run_tuned.py's own callback, as train_tuned.py's --report is for a model file.
Beside it, the Trainer's own ``train_samples_per_second`` over the whole run (its first steps
and a compile included) is shown. The order alternates from pair to pair (B T, T B).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.verify.stats import median_interval

TRAINER_RATE = re.compile(r"'train_samples_per_second': '?([0-9.]+)'?")
# what a user's shell would not have set: the knobs' variables come from launch.sh alone
KNOB_VARIABLES = ("LD_PRELOAD", "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "MALLOC_CONF")


def run(command: list[str], *, steps: int, env: dict[str, str]) -> tuple[float, float | None]:
    """(samples/s after the warm-up, the Trainer's own train_samples_per_second)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        proc = subprocess.run([*command, "--max-steps", str(steps), "--report", str(report)], env=env,
                              capture_output=True, text=True, timeout=1800)
        text = proc.stdout + proc.stderr
        if proc.returncode != 0 or not report.exists():
            raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n{text[-3000:]}")
        rate = json.loads(report.read_text())["samples_per_s"]
    trainer = TRAINER_RATE.findall(text)
    return float(rate), float(trainer[-1]) if trainer else None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="the output folder of an autotune run of a Trainer script")
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--seconds", type=float, default=10.0)
    args = p.parse_args()
    out = args.out.resolve()
    doc = json.loads((out / "best_config.json").read_text())
    env = {k: v for k, v in os.environ.items() if k not in KNOB_VARIABLES}
    plain = [sys.executable, str(out / "run_tuned.py"), "--as-written"]
    tuned = ["bash", str(out / "launch.sh")]
    base_cfg, cfg = doc["baseline"]["config"], doc["config"]
    steps = {"baseline": max(10, round(args.seconds * doc["baseline"]["samples_per_s"] / base_cfg["batch_size"])),
             "tuned": max(10, round(args.seconds * (doc["best"] or doc["baseline"])["samples_per_s"]
                                    / cfg["batch_size"]))}
    ratios, trainer_ratios = [], []
    for i in range(args.pairs):
        order = [("baseline", plain), ("tuned", tuned)]
        if i % 2:
            order.reverse()
        got = {name: run(command, steps=steps[name], env=env) for name, command in order}
        ratios.append(got["tuned"][0] / got["baseline"][0])
        if got["tuned"][1] and got["baseline"][1]:
            trainer_ratios.append(got["tuned"][1] / got["baseline"][1])
        print(f"pair {i + 1}: baseline {got['baseline'][0]:.1f}, tuned {got['tuned'][0]:.1f} samples/s, "
              f"ratio {ratios[-1]:.3f} (the Trainer's own figures: {got['baseline'][1]}, {got['tuned'][1]})",
              flush=True)
    low, high, coverage = median_interval(ratios)
    speedup = doc.get("speedup") or {}
    low_printed, high_printed = speedup.get("ci_low"), speedup.get("ci_high")
    median = statistics.median(ratios)
    inside = low_printed is not None and high_printed is not None and low_printed <= median <= high_printed
    print(json.dumps({"pairs": args.pairs, "steps": steps, "ratios": ratios, "median": median,
                      "median_interval": [low, high], "coverage": coverage,
                      "trainer_ratios": trainer_ratios,
                      "trainer_median": statistics.median(trainer_ratios) if trainer_ratios else None,
                      "printed_interval": [low_printed, high_printed], "printed_median": speedup.get("median"),
                      "inside_printed_interval": inside}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
