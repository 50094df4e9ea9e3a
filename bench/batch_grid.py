"""Measure a run's emitted configuration against a grid of global batch sizes, each run alone
with the emitted script's template, independently of autotune's search and verification.

    python bench/batch_grid.py autotune-out/small_batch_mlp --batches 16-8192 --rounds 3

Each grid point is the emitted configuration with another batch size (and, with --layouts,
another ranks x threads), at the emitted precision; the emitted configuration itself is
measured in every round too. Rounds rotate the order; each point's rate is its median over
the rounds, and the emitted one's share of the grid's best is computed round by round: against the point with
the best median (paired, its range over the rounds), and against each round's fastest point
(biased low: the largest of many noisy runs).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import Layout, TrialConfig
from autotune.document import paths
from autotune.document.run import RunDocument
from autotune.emit import outputs as emit
from autotune.options import parse_batch_range
from autotune.probes import probe_machine
from autotune.trials import launch
from autotune.trials.runner import run_launcher


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="a run's output folder")
    p.add_argument("--batches", default="16-8192", help="LOW-HIGH: the powers of two between, and both ends")
    p.add_argument("--layouts", default="", help="comma-separated RANKSxTHREADS to cross with the batches")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=6.0)
    args = p.parse_args()
    doc = RunDocument.from_json(json.loads((args.out / "best_config.json").read_text()))
    low, high = parse_batch_range(args.batches)
    batches = sorted({low, high, *(2 ** k for k in range(high.bit_length()) if low <= 2 ** k <= high)})
    layouts = [Layout.parse(s) for s in args.layouts.split(",") if s] or [Layout(doc.config.nprocs,
                                                                              doc.config.threads)]
    folder = args.out / "batch-grid"
    points: dict[str, TrialConfig] = {"emitted": doc.config}
    for layout in layouts:
        for batch in batches:
            if batch % layout.nprocs == 0:
                cfg = doc.config.replace(nprocs=layout.nprocs, threads=layout.threads, batch_size=batch)
                if cfg != doc.config:  # the emitted configuration is measured once a round, as itself
                    points[f"{layout} batch {batch}"] = cfg
    machine = probe_machine()
    launchers = {}
    for name, cfg in points.items():
        env, _ = launch.environment(cfg, machine=machine)  # as verification writes a candidate's
        written = emit.write_candidate(folder / name.replace(" ", "_"), cfg=cfg,
                                       model_file=paths.model_file(doc, args.out), env=env, description=name)
        launchers[name] = paths.resolve(written, folder / name.replace(" ", "_"), "launcher")
    rates: dict[str, list[float]] = {name: [] for name in points}
    guess = {name: (doc.best or doc.baseline).samples_per_s for name in points}
    names = list(points)
    for i in range(args.rounds):
        order = names[i % len(names):] + names[:i % len(names)]
        for name in order:
            steps = 3 + max(3, int(args.seconds * guess[name] / points[name].batch_size))
            report = run_launcher(launchers[name], steps=steps, workdir=folder / "runs" / f"{i}",
                                  timeout_s=600)
            if report.samples_per_s is None:
                raise SystemExit(f"{name}: the run timed no step (stopped by signal {report.stopped_by})")
            rates[name].append(report.samples_per_s)
            guess[name] = report.samples_per_s
            print(f"round {i + 1} {name}: {report.samples_per_s:.1f} samples/s", flush=True)
    grid = [n for n in names if n != "emitted"]
    shares = [rates["emitted"][i] / max(rates[n][i] for n in grid) for i in range(args.rounds)]
    best = max(grid, key=lambda n: statistics.median(rates[n]))
    # paired: the emitted configuration against the grid's best point (by medians), round by round
    paired = sorted(rates["emitted"][i] / rates[best][i] for i in range(args.rounds))
    result = {"emitted": doc.config.short(), "rates": {n: statistics.median(v) for n, v in rates.items()},
              "best": best,
              "emitted_over_best_medians": statistics.median(rates["emitted"]) / statistics.median(rates[best]),
              "emitted_over_best_paired": {"median": statistics.median(paired), "rounds": paired,
                                           "low": paired[0], "high": paired[-1]},
              "emitted_share_of_best_per_round": shares,
              "emitted_share_of_best": statistics.median(shares)}
    text = json.dumps(result, indent=1)
    print(text)
    (folder / "result.json").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
