"""How often the quality check accepts a precision, over seeded runs of the check, beside
the check it replaced (one fp32 training against the candidate's, from one seed, within 2%
of fp32's score).

Each run of the check is the gates of verification (numerics, then quality) on real
trials, with every training's seed moved by the run's: the fp32 references from seeds
s and s+1, the candidate from s. The old check's verdict is read from the same
trainings: seed s's fp32 score at the end against the candidate's.

    python bench/quality_seeds.py tests/models/bf16_noisy.py --runs 20 --out OUT

Prints each run's verdicts and the counts; OUT/quality_seeds.json holds every judgement.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import TrialConfig
from autotune.probes import probe_machine
from autotune.runtime.session import load_user_module
from autotune.trials.runner import TrialRunner
from autotune.verify.gates import gate
from autotune.verify.quality import PRECISION_QUALITY_DROP
from autotune.verify.settings import Settings
from autotune.verify.trainings import Trainings


def old_verdict(check_detail: Mapping[str, Any]) -> str:
    """The check of 55ea3ca: one pair from one seed, within 2% of fp32's metric."""
    ref, cand = check_detail["reference_metric"], check_detail["candidate_metric"]
    return "rejected" if ref - cand > PRECISION_QUALITY_DROP * abs(ref) else "accepted"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_file")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--first-seed", type=int, default=100)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    user = load_user_module(str(Path(args.model_file).resolve()))
    machine = probe_machine()
    gpu = bool(machine.to_json().get("gpus"))
    # on CPU, tcmalloc: one warm process runs every training (glibc's allocator gets a fresh one each)
    baseline = TrialConfig.from_dict({"batch_size": int(getattr(user, "batch_size", 32)),
                                      "device": "cuda" if gpu else "cpu", "backend": "nccl" if gpu else "gloo",
                                      "allocator": "default" if gpu else "tcmalloc", "num_workers": 0})
    cand = baseline.replace(precision=args.precision)
    runner = TrialRunner(model_file=args.model_file, machine=machine, workdir=args.out)
    rows = []
    for run in range(args.runs):
        seed = args.first_seed + 10 * run
        runner.seed, runner.workdir = seed, args.out / f"run{run}"  # one warm process for all
        started = time.perf_counter()
        verdict = gate(Trainings(runner, evaluate=True), baseline, cand, settings=Settings())
        numerics, quality = verdict.checks["numerics"], verdict.checks.get("quality")
        judged = (quality.detail.get("judgement") or {}) if quality is not None else {}
        row = {"seed": seed, "seconds": time.perf_counter() - started, "passed": verdict.passed,
               "numerics": numerics.passed, "reason": verdict.reason,
               "verdict": judged.get("verdict", "rejected: numerics" if not numerics.passed else None),
               "old": old_verdict(quality.detail) if quality is not None and "reference_metric" in quality.detail
               else ("rejected" if not numerics.passed else None),
               "judgement": judged}
        rows.append(row)
        print(f"seed {seed}: new {row['verdict']}, old {row['old']}, spread {judged.get('spread', float('nan')):.4g}, "
              f"distance {judged.get('distance', float('nan')):.4g} ({row['seconds']:.0f} s)", flush=True)
    runner.close()
    counts = {"new_accepted": sum(r["passed"] is True for r in rows),
              "old_accepted": sum(r["old"] == "accepted" for r in rows), "runs": len(rows)}
    print(json.dumps(counts))
    (args.out / "quality_seeds.json").write_text(json.dumps({"counts": counts, "runs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
