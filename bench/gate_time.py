"""How long verification's gates (numerics, quality, and the batch check where the batch is
not the user's) take for one reduced-precision candidate, on real trials.

    python bench/gate_time.py examples/fashion_cnn.py --batch 64 --repeats 3

Each repeat gates the candidate afresh (a new trials folder: nothing kept from a run
before). AUTOTUNE_TREE=PATH gates with the autotune source tree at PATH instead of this
one, so that two commits can be timed alternately in one session:

    for i in 1 2 3; do AUTOTUNE_TREE=/tmp/old python bench/gate_time.py ... --repeats 1
                       python bench/gate_time.py ... --repeats 1; done
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(os.environ.get("AUTOTUNE_TREE") or Path(__file__).resolve().parent.parent)
sys.path.insert(0, str(ROOT))

from autotune.config import TrialConfig
from autotune.probes import probe_machine
from autotune.runtime.session import load_user_module
from autotune.trials.runner import TrialRunner
from autotune.verify.gates import gate
from autotune.verify.settings import Settings
from autotune.verify.trainings import Trainings


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_file")
    p.add_argument("--precision", default="bf16")
    p.add_argument("--batch", type=int, default=None, help="the candidate's batch (default: the user's)")
    p.add_argument("--repeats", type=int, default=1)
    args = p.parse_args()
    user = load_user_module(str(Path(args.model_file).resolve()))
    baseline = TrialConfig(batch_size=int(getattr(user, "batch_size", 32)))
    cand = baseline.replace(precision=args.precision, batch_size=args.batch or baseline.batch_size)
    machine = probe_machine()
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory() as work:
            runner = TrialRunner(model_file=args.model_file, machine=machine, workdir=work)
            started = time.perf_counter()
            verdict = gate(Trainings(runner, evaluate=True), baseline, cand, settings=Settings())
            seconds = time.perf_counter() - started
            runner.close()
        print(json.dumps({"tree": str(ROOT), "candidate": cand.short(), "seconds": round(seconds, 1),
                          "passed": verdict.passed, "reason": verdict.reason}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
