"""An independent check of a verdict at the script's own full length: the user's script as
written and with autotune's answer, each run whole from the same seeds in fresh processes,
with no code of autotune's; each run's final metric is the number after ``final`` on the
last line that has one (the noisy scripts of bench/workloads print it).

    python bench/seeded_finals.py --seeds 0 1 2 \\
        --as-written 'python bench/workloads/noisy_lightning.py --seed {seed}' \\
        --answer 'python /tmp/patched/noisy_lightning.py --seed {seed}'

Prints each seed's two finals and their difference, the means, and each run's seconds.
"""
from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import time


def final(command: str, seed: int) -> tuple[float, float]:
    started = time.perf_counter()
    proc = subprocess.run(shlex.split(command.format(seed=seed)), capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - started
    lines = [line for line in proc.stdout.splitlines() if line.startswith("final ")]
    return float(lines[-1].split()[1]), seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--as-written", required=True)
    p.add_argument("--answer", required=True)
    args = p.parse_args()
    rows = []
    for seed in args.seeds:
        written, written_s = final(args.as_written, seed)
        answer, answer_s = final(args.answer, seed)
        rows.append({"seed": seed, "as_written": written, "answer": answer, "drop": written - answer,
                     "as_written_s": written_s, "answer_s": answer_s})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"mean_as_written": statistics.fmean(r["as_written"] for r in rows),
                      "mean_answer": statistics.fmean(r["answer"] for r in rows),
                      "mean_drop": statistics.fmean(r["drop"] for r in rows)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
