"""Is what a reduced precision loses on evaluate() more than fp32 loses to itself?

The quality check trains the fp32 reference and the candidate once each, from one seed, over
the same samples, and rejects the candidate where evaluate() drops by more than its
allowance. A short training can land far from where another seed's would: this runs the
check's own trainings (real trials in quality mode, as ``verify.trainings`` runs them) for
several seeds of the fp32 reference and of the candidate, and prints evaluate() of each,
fp32's spread over seeds beside the candidate's drop at each seed.

    python bench/quality_spread.py bench/workloads/gpt2_small.py --candidate precision=bf16 \\
        --seeds 0,1 --candidate-seeds 0,1,2 --out OUT

A configuration is KNOB=VALUE,... over the model file's own batch size and autotune's
baseline (fp32, nothing turned), read by bench/gpu_mfu.py's parse_config. OUT/quality_spread.json holds
every training's losses and score.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import TrialConfig
from autotune.probes import probe_machine
from autotune.runtime.session import load_user_module
from autotune.trials.runner import Measurement, TrialRunner
from autotune.verify.quality import PRECISION_QUALITY_DROP
from autotune.verify.reference import quality_reference
from autotune.verify.trainings import training_steps
from bench.gpu_mfu import parse_config


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_file")
    p.add_argument("--candidate", default="precision=bf16", help="KNOB=VALUE,... (default precision=bf16)")
    p.add_argument("--seeds", default="0,1", help="the fp32 reference's seeds (default 0,1)")
    p.add_argument("--candidate-seeds", default=None, help="the candidate's seeds (default: --seeds)")
    p.add_argument("--samples", type=int, default=6400, help="samples trained (default: the quality check's)")
    p.add_argument("--timeout", type=float, default=900, help="most seconds one training gets")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    machine = probe_machine()
    device = "cuda" if machine.gpus else "cpu"
    user = load_user_module(str(Path(args.model_file).resolve()))
    baseline = TrialConfig.from_dict({"batch_size": int(getattr(user, "batch_size", 32)), "device": device,
                                      "backend": "nccl" if device == "cuda" else "gloo"})
    cand = TrialConfig.from_dict({**baseline.to_dict(), **parse_config(f'candidate:{args.candidate}')[1]})
    ref = quality_reference(baseline, cand)
    steps = training_steps(cand, evaluate=True, numerics_steps=40, quality_samples=args.samples)
    seeds = [int(s) for s in args.seeds.split(",")]
    cand_seeds = [int(s) for s in (args.candidate_seeds or args.seeds).split(",")]
    doc: dict[str, Any] = {"model_file": args.model_file, "reference": ref.short(), "candidate": cand.short(),
                           "steps": steps, "runs": []}
    plan = [("fp32", ref, s) for s in seeds] + [("candidate", cand, s) for s in cand_seeds]
    # alternate, so that whatever drifts on the machine meets both alike
    plan.sort(key=lambda item: (item[2], item[0] != "fp32"))
    for role, cfg, seed in plan:
        runner = TrialRunner(model_file=args.model_file, machine=machine, workdir=args.out / "trials",
                             measurement=Measurement(), timeout_s=args.timeout, seed=seed, warm=False)
        t0 = time.perf_counter()
        res = runner.run(cfg, name=f"{role}-seed{seed}", quality_steps=steps)
        runner.close()
        losses = list(res.done.losses) if res.done is not None else []
        row = {"role": role, "seed": seed, "status": str(res.status), "metric": res.metric,
               "wall_s": round(time.perf_counter() - t0, 1),
               "loss_every_10pct": losses[:: max(1, len(losses) // 10)] + losses[-1:],
               "failure": None if res.metric is not None else res.describe_failure()}
        doc["runs"].append({**row, "losses": losses})
        print(json.dumps(row), flush=True)
        (args.out / "quality_spread.json").write_text(json.dumps(doc, indent=1))
    scores = {role: [r["metric"] for r in doc["runs"] if r["role"] == role and r["metric"] is not None]
              for role in ("fp32", "candidate")}
    if scores["fp32"] and scores["candidate"]:
        f, c = scores["fp32"], scores["candidate"]
        allowed = PRECISION_QUALITY_DROP * abs(f[0])
        summary = {"fp32": f, "candidate": c, "fp32_spread": max(f) - min(f),
                   "drop_of_medians": statistics.median(f) - statistics.median(c),
                   "allowed_by_the_check": allowed,
                   "same_seed_drops": {r["seed"]: next(x["metric"] for x in doc["runs"] if x["role"] == "fp32"
                                                       and x["seed"] == r["seed"]) - r["metric"]
                                       for r in doc["runs"] if r["role"] == "candidate" and r["metric"] is not None
                                       and r["seed"] in seeds}}
        doc["summary"] = summary
        (args.out / "quality_spread.json").write_text(json.dumps(doc, indent=1))
        print(json.dumps({"summary": summary}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
