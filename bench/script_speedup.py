"""Check a Trainer script's reported speedup by running the user's script itself: the
script as written (``python SCRIPT ARGS``, the user's own command and environment) against
the emitted ``launch.sh`` (the same script with the tuned arguments and environment),
alternating, each alone, and the Trainer's own ``train_samples_per_second`` as the figure.

    python bench/script_speedup.py autotune-out/hf_trainer --rounds 4

Nothing of autotune measures here: each run is the user's whole training as the script
sets it (its epochs, its evaluation at each epoch's end), and the figure is the one the
Trainer prints when train() returns. The order alternates from round to round (B T, T B).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.verify.stats import median_interval

RATE = re.compile(r"'train_samples_per_second': '?([0-9.]+)'?")
# what a user's shell would not have set: the knobs' variables come from launch.sh alone
KNOB_VARIABLES = ("LD_PRELOAD", "OMP_NUM_THREADS", "OMP_PROC_BIND", "OMP_PLACES", "MALLOC_CONF")


def rate_of(command: list[str], *, cwd: Path, env: dict[str, str]) -> float:
    proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=1800)
    found = RATE.findall(proc.stdout + proc.stderr)
    if proc.returncode != 0 or not found:
        raise SystemExit(f"{' '.join(command)} failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    return float(found[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="the output folder of an autotune run of a Trainer script")
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    out = args.out.resolve()
    doc = json.loads((out / "best_config.json").read_text())
    settings = json.loads((out / "run_tuned.json").read_text())
    script = Path(settings["script_tuned"])
    env = {k: v for k, v in os.environ.items() if k not in KNOB_VARIABLES}
    env["HF_HUB_OFFLINE"] = "1"
    plain = [sys.executable, str(script), *settings["argv"]]
    tuned = ["bash", str(out / "launch.sh")]
    cwd = Path.cwd()
    ratios, base_rates, tuned_rates = [], [], []
    for i in range(args.rounds):
        order = [("baseline", plain), ("tuned", tuned)]
        if i % 2:
            order.reverse()
        got = {name: rate_of(command, cwd=cwd, env=env) for name, command in order}
        base_rates.append(got["baseline"])
        tuned_rates.append(got["tuned"])
        ratios.append(got["tuned"] / got["baseline"])
        print(f"round {i + 1}: baseline {got['baseline']:.1f}, tuned {got['tuned']:.1f} samples/s "
              f"(Trainer's train_samples_per_second), ratio {ratios[-1]:.3f}", flush=True)
    median = statistics.median(ratios)
    low, high, coverage = median_interval(ratios)
    speedup = doc.get("speedup") or {}
    low_printed, high_printed = speedup.get("ci_low"), speedup.get("ci_high")
    inside = low_printed is not None and high_printed is not None and low_printed <= median <= high_printed
    printed = (low_printed, high_printed)
    print(json.dumps({"script": str(script), "rounds": args.rounds, "ratios": ratios, "median": median,
                      "median_interval": [low, high], "coverage": coverage, "baseline_samples_per_s": base_rates,
                      "tuned_samples_per_s": tuned_rates, "printed_interval": printed,
                      "printed_median": speedup.get("median"), "inside_printed_interval": inside}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
