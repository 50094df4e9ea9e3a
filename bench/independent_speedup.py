"""Check a run's reported speedup independently of autotune's measurement code:
time the emitted launch.sh against a baseline script, alternating, and compare with
the interval verification reported.

    python bench/independent_speedup.py autotune-out/fashion_cnn --pairs 6 --seconds 8

The baseline is the same train_tuned.py template with the baseline config (what the
user runs today). Each run trains for about --seconds; the script's own --report gives
samples/s over its steps after warm-up. Ratios come from adjacent runs (B T, T B, ...).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune import emit  # noqa: E402
from autotune.config import TrialConfig  # noqa: E402
from autotune.trial import run_launcher  # noqa: E402
from autotune.verify import median_interval  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--seconds", type=float, default=8.0)
    args = p.parse_args()
    doc = json.loads((args.out / "best_config.json").read_text())
    base_cfg = TrialConfig.from_dict(doc["baseline"]["config"])
    tuned_cfg = TrialConfig.from_dict(doc["config"])
    folder = args.out / "independent"
    base_doc = emit.write_outputs(folder / "baseline", cfg=base_cfg, model_file=Path(doc["model_file"]),
                                  env={}, document={}, description="baseline")
    launchers = {"baseline": Path(base_doc["outputs"]["launcher"]),
                 "tuned": Path(doc["outputs"]["launcher"])}
    rates = {"baseline": doc["baseline"]["samples_per_s"], "tuned": doc["best"]["samples_per_s"]}
    cfgs = {"baseline": base_cfg, "tuned": tuned_cfg}
    values: dict[str, list[float]] = {"baseline": [], "tuned": []}
    for i in range(args.pairs):
        order = ["baseline", "tuned"] if i % 2 == 0 else ["tuned", "baseline"]
        for name in order:
            steps = 3 + int(args.seconds * rates[name] / cfgs[name].batch_size)
            report = run_launcher(launchers[name], steps=steps, workdir=folder / f"{name}-{i}",
                                  timeout_s=600)
            values[name].append(report["samples_per_s"])
            print(f"pair {i + 1} {name}: {report['samples_per_s']:.1f} samples/s", flush=True)
    ratios = [t / b for t, b in zip(values["tuned"], values["baseline"])]
    low, high, level = median_interval(ratios, confidence=0.8)
    result = {
        "ratios": ratios, "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios),
        "interval": [low, high], "interval_level": level,
        "reported": doc["speedup"],
        "median_inside_reported_interval": doc["speedup"]["ci_low"] <= statistics.median(ratios)
        <= doc["speedup"]["ci_high"],
    }
    print(json.dumps(result, indent=1))
    (folder / "result.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
