"""Check a run's reported speedup independently of autotune's measurement code:
time the emitted launch.sh against a baseline script, alternating, and compare with
the interval verification reported.

    python bench/independent_speedup.py autotune-out/fashion_cnn --pairs 6 --seconds 8
    python bench/independent_speedup.py OUT_BF16 OUT_EXACT   # several runs, side by side

The baseline is the same train_tuned.py template with the baseline config (what the
user runs today). Each run trains for about --seconds; the script's own --report gives
samples/s over its steps after warm-up. Ratios come from runs of the same round; the order
rotates from round to round (B T, T B, ...).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.document import paths
from autotune.document.run import RunDocument
from autotune.emit import outputs as emit
from autotune.trials.runner import run_launcher
from autotune.verify.stats import median_interval


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, nargs="+",
                   help="output folders of runs of the same model file; the first one's "
                        "baseline is the baseline of all")
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--seconds", type=float, default=8.0)
    args = p.parse_args()
    docs = [RunDocument.from_json(json.loads((out / "best_config.json").read_text())) for out in args.out]
    folder = args.out[0] / "independent"
    base_cfg = docs[0].baseline.config
    base_doc = emit.write_candidate(folder / "baseline", cfg=base_cfg,
                                    model_file=paths.model_file(docs[0], args.out[0]), env={},
                                    description="baseline")
    names = ["baseline"] + [f"tuned-{i}" for i in range(len(docs))]
    launchers = {"baseline": paths.resolve(base_doc, folder / "baseline", "launcher")}
    rates = {"baseline": docs[0].baseline.samples_per_s}
    cfgs = {"baseline": base_cfg}
    for name, doc, out in zip(names[1:], docs, args.out):
        launchers[name] = paths.resolve(doc, out, "launcher")
        rates[name] = (doc.best or doc.baseline).samples_per_s
        cfgs[name] = doc.config
    values: dict[str, list[float]] = {name: [] for name in names}
    for i in range(args.pairs):
        # every run alone on the machine; the order rotates so none always follows another
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            steps = 3 + int(args.seconds * rates[name] / cfgs[name].batch_size)
            report = run_launcher(launchers[name], steps=steps, workdir=folder / f"{name}-{i}",
                                  timeout_s=600)
            if report.samples_per_s is None:
                raise SystemExit(f"{name}: the run timed no step (stopped by signal {report.stopped_by})")
            values[name].append(report.samples_per_s)
            print(f"round {i + 1} {name}: {report.samples_per_s:.1f} samples/s", flush=True)
    results = []
    for name, out, doc in zip(names[1:], args.out, docs):
        ratios = [t / b for t, b in zip(values[name], values["baseline"])]
        low, high, level = median_interval(ratios, confidence=0.8)
        results.append({
            "out": str(out), "config": cfgs[name].short(),
            "ratios": ratios, "samples_per_s": values[name], "baseline_samples_per_s": values["baseline"],
            "median": statistics.median(ratios), "min": min(ratios),
            "max": max(ratios), "interval": [low, high], "interval_level": level,
            "reported": doc.speedup.to_json() if doc.speedup else None,
            "median_inside_reported_interval": None if doc.speedup is None
            else doc.speedup.interval.low <= statistics.median(ratios) <= doc.speedup.interval.high,
        })
    if len(docs) > 1:  # each further run against the first, round by round
        for name, result in zip(names[2:], results[1:]):
            ratios = [a / b for a, b in zip(values[name], values["tuned-0"])]
            low, high, level = median_interval(ratios, confidence=0.8)
            result["against_first"] = {"median": statistics.median(ratios), "interval": [low, high],
                                       "interval_level": level}
    text = json.dumps(results if len(results) > 1 else results[0], indent=1)
    print(text)
    (folder / "result.json").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
