"""Does a held process measure a configuration as a fresh one does? On GPUs verification
holds one process per configuration between its windows (``autotune.verify.device_room``),
which is sound only if a held process runs at the speed a fresh one does.

For the emitted configuration and the baseline of a run, each in turn: one process held
for the whole session, and the same configuration started fresh for each visit beside it,
measured in the verification's own rounds (each visit three windows, the held one as
many, alternating); the held rate over the fresh one, per round, with its interval.

    python bench/held_vs_fresh.py autotune-out/fashion_cnn --visits 3

Where an interval excludes 1.0, the knob that differs between the configurations that
agree and the one that does not is the one to give fresh processes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.document import paths
from autotune.document.run import RunDocument
from autotune.harness import make_runner
from autotune.options import RunOptions
from autotune.probes import probe_machine
from autotune.sections import MeasureOptions
from autotune.task import load_task
from autotune.verify import side_by_side
from autotune.verify.stats import ratio_interval


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path, help="a run's output folder")
    p.add_argument("--visits", type=int, default=3, help="fresh visits per configuration")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args()
    doc = RunDocument.from_json(json.loads((args.out / "best_config.json").read_text()))
    task = load_task(paths.model_file(doc, args.out))
    machine = probe_machine()
    runner = make_runner(task, machine, args.out / "held-vs-fresh", MeasureOptions.of(RunOptions()))
    plan = side_by_side.Visits(held=frozenset({0}), per_visit=side_by_side.WINDOWS_PER_VISIT, visits=args.visits)
    figures = {}
    try:
        for role, cfg in (("emitted", doc.config), ("baseline", doc.baseline.config)):
            session = side_by_side.measure(runner, [cfg, cfg], plan=plan, progress=lambda kind, info: None,
                                            name=f"held-vs-fresh-{role}", reference_label="held", rule=None)
            held, fresh = session.values
            if session.failures[1] or not fresh:
                print(f"{role}: the fresh process failed: {session.failures[1]}")
                continue
            found = ratio_interval([h / f for h, f in zip(held, fresh)])
            interval = {"median": found.ratio, "ci_low": found.low, "ci_high": found.high, "ci_level": found.level}
            figures[role] = {"config": cfg.short(), "held_samples_per_s": held, "fresh_samples_per_s": fresh,
                             **interval}
            alike = found.low <= 1.0 <= found.high
            print(f"{role} ({cfg.short()}): held/fresh {interval['median']:.3f} "
                  f"({interval['ci_level']:.0%} interval {interval['ci_low']:.3f}-{interval['ci_high']:.3f}) "
                  f"over {len(held)} rounds: {'alike' if alike else 'NOT alike'}")
    finally:
        runner.close()
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
