"""Does a standalone run measure alike while the next one sets up beside it? On a GPU node
verification's pairs start the next runs while one trains (``autotune.verify.overlap``):
sound only where the run that trains measures the same with a process setting up beside it
(its interpreter, imports, data set, model and CUDA context) as with nothing beside it.

For a run's emitted launch.sh, pair after pair, the order alternating: one run started,
given ``--setup`` seconds to set up and then let go with nothing beside it ("alone"), and
one likewise but let go the moment another run starts setting up beside it ("beside"). Both
were held the same way: only what runs beside them differs. The rate beside over alone,
per pair, with its interval:

    python bench/overlap_bias.py autotune-out/fashion_cnn --pairs 4 --seconds 4

An interval that excludes 1.0 means the overlap biases the pairs there: keep them
sequential on such a machine (``overlap.ahead``) and say why.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.document.run import RunDocument
from autotune.trials.runner import start_launcher
from autotune.verify.stats import ratio_interval


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="a run's output folder (its launch.sh)")
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--seconds", type=float, default=4.0, help="timed training per run, about")
    p.add_argument("--setup", type=float, default=20.0,
                   help="seconds a held run is given to set up before it is let go")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    out = args.out.absolute()
    doc = RunDocument.from_json(json.loads((out / "best_config.json").read_text()))
    launcher = out / "launch.sh"
    rate = doc.best.samples_per_s if doc.best is not None else doc.baseline.samples_per_s
    steps = 3 + max(10, int(args.seconds * rate / doc.config.batch_size))
    work = out / "overlap-bias"
    rates: dict[str, list[float]] = {"alone": [], "beside": []}
    for i in range(args.pairs):
        for mode in (("alone", "beside") if i % 2 == 0 else ("beside", "alone")):
            run = start_launcher(launcher, steps=steps, workdir=work / f"{mode}-{i}", timeout_s=600, hold=True)
            time.sleep(args.setup)
            other = (start_launcher(launcher, steps=steps, workdir=work / f"setting-up-{mode}-{i}", timeout_s=600,
                                    hold=True) if mode == "beside" else None)
            try:
                report = run.finish()
            finally:
                if other is not None:
                    other.cancel()
            rates[mode].append(float(report.samples_per_s or 0.0))
            print(f"pair {i + 1} {mode}: {rates[mode][-1]:,.1f} samples/s", flush=True)
    ratios = [b / a for b, a in zip(rates["beside"], rates["alone"])]
    interval = ratio_interval(ratios)
    alike = interval.low <= 1.0 <= interval.high
    print(f"beside/alone {interval.ratio:.3f} ({interval.level:.0%} interval {interval.low:.3f}-"
          f"{interval.high:.3f}) over {len(ratios)} pairs: "
          + ("alike" if alike else "DIFFERENT: a run setting up beside changes the measured speed"))
    print(f"alone median {statistics.median(rates['alone']):,.1f}, beside median "
          f"{statistics.median(rates['beside']):,.1f} samples/s; {doc.config.short()}")
    if args.json:
        args.json.write_text(json.dumps({"config": doc.config.short(), **rates, "ratios": ratios,
                                         **interval.to_json()}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
