"""How far reduced-precision losses stray from fp32 on healthy models: the data behind
``verify.numerics.NUMERICS_TOLERANCE``.

For each workload and batch size, the fp32 one-process eager reference and the reduced
precision run train from the same seed, weights and batches (real trials, the numerics
check's own trajectory mode); the per-step relative loss differences are summarised with
the statistic the numerics check uses. Run it on a machine where the precision is native.

    python bench/precision_tolerance.py --precision bf16 --steps 40 --out bench-out/tolerance.json
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import TrialConfig
from autotune.probes import probe_machine
from autotune.task import load_task
from autotune.trials.runner import Measurement, TrialRunner
from autotune.verify import numerics

WORKLOADS = [ROOT / "examples" / "fashion_cnn.py",
             *sorted((ROOT / "bench" / "workloads").glob("*.py"))]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--precision", default="bf16")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--multipliers", default="1,4", help="batch sizes as multiples of the file's")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    machine = probe_machine().to_json()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in WORKLOADS:
            task = load_task(path)
            runner = TrialRunner(model_file=path, machine=machine, workdir=Path(tmp) / path.stem,
                                 measurement=Measurement())
            for m in (int(x) for x in args.multipliers.split(",")):
                base = TrialConfig(batch_size=task.batch_size * m)
                ref = runner.run(base, name=f"ref-{m}", trajectory_steps=args.steps)
                cand = runner.run(base.replace(precision=args.precision), name=f"cand-{m}",
                                  trajectory_steps=args.steps)
                if ref.status != "ok" or cand.status != "ok":
                    rows.append({"workload": path.stem, "batch_size": base.batch_size,
                                 "failed": ref.describe_failure() if ref.status != "ok"
                                 else cand.describe_failure()})
                    continue
                stats = numerics.loss_divergence(ref.losses, cand.losses)
                rows.append({"workload": path.stem, "batch_size": base.batch_size, **stats,
                             "reference_losses": ref.losses, "candidate_losses": cand.losses})
                print(f"{path.stem:16s} batch {base.batch_size:5d}  "
                      + "  ".join(f"{k} {v:.4f}" for k, v in stats.items() if isinstance(v, float)),
                      flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"precision": args.precision, "steps": args.steps,
                                        "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
