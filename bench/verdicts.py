"""Both error rates of the gates' verdicts (``autotune.verify.decide``), on calibration
models whose truth is known, over seeded runs of the check.

Each run trains, on real trials, the pairs a verdict would train (the candidate and what it
is judged against, from the same seeds: the quality check's fp32 twin, the batch check's
user's batch) for as many seeds as a verdict may take, then replays the verdict as
verification takes it (``decide.sequential`` over those pairs, ``decide.judge``): its
verdict, how many seeds it took, and what those trainings cost in seconds. A reduced
precision goes through the numerics check first, as in a run (its rejection is the gate's
verdict). Every pair is stored, so ``--rescore`` replays another rule on the same trainings.

The cases (``CASES``):
  noisy-precision   tests/models/noisy_cnn.py, bf16 at its batch: harmless (accepted)
  chaotic-precision tests/models/bf16_noisy.py, bf16: harmless, and its trajectories part
                    as another seed's would (accepted)
  harmful-precision tests/models/bf16_cancels.py, bf16: the loss stops falling (rejected)
  losing-batch      tests/models/slow_learner.py, batch 256 against 16 at its learning rate:
                    16 times fewer steps of the same size (rejected)
  indifferent-batch tests/models/bf16_noisy.py, batch 32 against 16 with the learning rate
                    scaled (--scale-lr linear): no loss at equal samples, the seeds far
                    apart (accepted; the truth is checked over every run's pairs)

    .venv/bin/python bench/verdicts.py --out OUT                    # all cases, 20 runs each
    .venv/bin/python bench/verdicts.py --out OUT --cases losing-batch --runs 5
    .venv/bin/python bench/verdicts.py --out OUT --rescore          # the table from OUT's records

OUT/verdicts.jsonl holds one record a run; the table goes to standard output.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import TrialConfig
from autotune.document.quality import QualityVerdict
from autotune.probes import probe_machine
from autotune.trials.runner import TrialRunner
from autotune.verify import decide
from autotune.verify.numerics import numerics_check
from autotune.verify.quality import PRECISION_QUALITY_DROP, by_samples
from autotune.verify.reference import quality_reference
from autotune.verify.trainings import Trainings

MODELS = ROOT / "tests" / "models"


@dataclasses.dataclass(frozen=True)
class Case:
    model: str
    batch: int
    change: dict[str, Any]
    gate: str  # "quality" or "batch"
    truth: QualityVerdict
    base: dict[str, Any] = dataclasses.field(default_factory=dict)  # the user's configuration besides its batch


CASES = {
    "noisy-precision": Case("noisy_cnn.py", 32, {"precision": "bf16"}, "quality", QualityVerdict.ACCEPTED),
    "chaotic-precision": Case("bf16_noisy.py", 16, {"precision": "bf16"}, "quality", QualityVerdict.ACCEPTED),
    "harmful-precision": Case("bf16_cancels.py", 32, {"precision": "bf16"}, "quality", QualityVerdict.REJECTED),
    "losing-batch": Case("slow_learner.py", 16, {"batch_size": 256}, "batch", QualityVerdict.REJECTED),
    "indifferent-batch": Case("bf16_noisy.py", 16, {"batch_size": 32}, "batch", QualityVerdict.ACCEPTED,
                              base={"lr_scaling": "linear"}),
}


def pairs_of(case: Case, runner: TrialRunner, seeds: int, allocator: str) -> dict[str, Any]:
    """The run's pairs (each seed's reference and candidate scores by samples, and their
    seconds), or the numerics check's rejection."""
    baseline = TrialConfig.from_dict({"batch_size": case.batch, "lr_batch": case.batch, "allocator": allocator,
                                      **case.base})
    cand = baseline.replace(**case.change)
    trainings = Trainings(runner, evaluate=True)
    if case.gate == "quality":
        started = time.perf_counter()
        numerics = numerics_check(trainings, baseline, cand)
        if not numerics.passed:
            return {"numerics": numerics.reason, "seconds": [time.perf_counter() - started]}
        reference = trainings.reference(quality_reference(baseline, cand))
        samples = trainings.steps(cand) * cand.batch_size
    else:
        reference = trainings.reference(baseline)
        samples = max(trainings.samples(baseline), trainings.samples(cand))
    out: dict[str, Any] = {"pairs": [], "seconds": [], "samples": samples}
    for seed in range(seeds):
        started = time.perf_counter()
        if case.gate == "quality":
            ref = trainings.of(reference, "reference", scored=True, seed=seed)
            got = trainings.of(cand, "candidate", scored=True, seed=seed)
            pair = (by_samples(ref, reference.batch_size), by_samples(got, cand.batch_size))
        else:
            ref = trainings.for_samples(reference, "batch-reference", samples=samples, seed=seed)
            got = trainings.for_samples(cand, "batch-candidate", samples=samples, seed=seed)
            pair = ({samples: math.nan if ref.metric is None else ref.metric},
                    {samples: math.nan if got.metric is None else got.metric})
        out["pairs"].append([{str(k): v for k, v in side.items()} for side in pair])
        out["seconds"].append(time.perf_counter() - started)
    return out


def replay(record: dict[str, Any], *, most: int) -> tuple[str, int, float]:
    """The verdict verification takes on the record's pairs, the seeds it took and their seconds."""
    if "numerics" in record:
        return QualityVerdict.REJECTED.value, 1, sum(record["seconds"])
    pairs = [tuple({int(k): v for k, v in side.items()} for side in pair) for pair in record["pairs"]]
    first = pairs[0][0][max(pairs[0][0])]
    unsettled = QualityVerdict.ACCEPTED if CASES[record["case"]].gate == "batch" else QualityVerdict.INCONCLUSIVE
    allowance = decide.Allowance(PRECISION_QUALITY_DROP * abs(first), "default", unsettled=unsettled)
    found = decide.sequential(lambda seed: pairs[seed],  # type: ignore[arg-type,return-value]
                              lambda seeds, final, more_s: decide.judge(
                                  seeds, allowance=allowance, samples=record["samples"], length="", final=final),
                              most=min(most, len(pairs)))
    assert not isinstance(found, str)
    return found.verdict.value, found.seeds, sum(record["seconds"][:found.seeds])


def table(records: list[dict[str, Any]], *, most: int) -> str:
    lines = ["| case | truth | runs | right | accepted | rejected | inconclusive | seeds (median, most) "
             "| seconds a verdict (median, most) | mean drop over every pair (sd) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, case in CASES.items():
        runs = [r for r in records if r["case"] == name]
        if not runs:
            continue
        verdicts = [replay(r, most=most) for r in runs]
        counts = {v.value: sum(1 for got, _, _ in verdicts if got == v.value) for v in QualityVerdict}
        drops = [float(p[0][max(p[0], key=int)]) - float(p[1][max(p[1], key=int)])
                 for r in runs for p in r.get("pairs", [])]
        spread = f"{statistics.fmean(drops):+.4f} ({statistics.stdev(drops):.4f})" if len(drops) > 1 else "-"
        seeds = [s for _, s, _ in verdicts]
        seconds = [s for _, _, s in verdicts]
        lines.append(f"| {name} | {case.truth.value} | {len(runs)} | {counts[case.truth.value]} "
                     f"| {counts['accepted']} | {counts['rejected']} | {counts['inconclusive']} "
                     f"| {statistics.median(seeds):g}, {max(seeds)} "
                     f"| {statistics.median(seconds):.1f}, {max(seconds):.1f} | {spread} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--cases", nargs="*", default=list(CASES))
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--seeds", type=int, default=decide.MOST_SEEDS, help="pairs trained a run")
    p.add_argument("--first-seed", type=int, default=100)
    p.add_argument("--rescore", action="store_true", help="the table from OUT's records; trains nothing")
    p.add_argument("--most", type=int, default=decide.MOST_SEEDS, help="the most seeds the replayed rule takes")
    p.add_argument("--noise-share", type=float, default=decide.NOISE_SHARE)
    args = p.parse_args()
    decide.NOISE_SHARE = args.noise_share
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "verdicts.jsonl"
    if not args.rescore:
        machine = probe_machine()
        # tcmalloc: trainings share one warm process (glibc's allocator gets a fresh one each)
        allocators = machine.to_json()["allocators"]
        allocator = "tcmalloc" if isinstance(allocators, dict) and allocators.get("tcmalloc") else "default"
        for name in args.cases:
            case = CASES[name]
            runner = TrialRunner(model_file=MODELS / case.model, machine=machine, workdir=args.out / name)
            try:
                for run in range(args.runs):
                    # a run's seeds are the runner's plus 0 .. seeds-1: runs apart by more
                    runner.seed = args.first_seed + (args.seeds + 2) * run
                    runner.workdir = args.out / name / f"run{run}"
                    found = pairs_of(case, runner, args.seeds, allocator)
                    record = {"case": name, "run": run, "seed": runner.seed, **found}
                    with path.open("a") as f:
                        f.write(json.dumps(record) + "\n")
                    print(name, run, replay(record, most=args.most), flush=True)
            finally:
                runner.shutdown()
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    print(table(records, most=args.most))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
