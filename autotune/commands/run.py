"""``autotune run FILE``: probe, search, verify, emit."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autotune.pipeline import EXIT_NOT_VERIFIED, EXIT_VERIFIED, RunOptions, tune
from autotune.report import Reporter
from autotune.space import parse_fixes


def _positive(kind: type, name: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be positive, got {text}")
        return value
    return parse


def add_common(p: argparse.ArgumentParser) -> None:
    """Options shared by run and verify: how trials are measured and verified."""
    p.add_argument("--window", type=_positive(float, "--window"), default=1.0,
                   help="seconds per measurement window (default 1.0)")
    p.add_argument("--windows", type=_positive(int, "--windows"), default=3,
                   help="measurement windows per trial (default 3)")
    p.add_argument("--trial-timeout", type=_positive(float, "--trial-timeout"), default=300.0,
                   help="seconds before a trial is killed (default 300)")
    p.add_argument("--hang-timeout", type=_positive(float, "--hang-timeout"), default=30.0,
                   metavar="SECONDS",
                   help="seconds without a finished step before a trial counts as hung (default "
                        "30; five of the trial's own steps where a step takes longer); setup "
                        "may take 5x the model file's check, at least 60 s")
    p.add_argument("--rounds", type=_positive(int, "--rounds"), default=10,
                   help="rounds of side-by-side windows that rank the candidates in "
                        "verification (default 10)")
    p.add_argument("--pairs", type=_positive(int, "--pairs"), default=6,
                   help="pairs of standalone runs (the emitted launch.sh and the baseline's "
                        "script, each alone) that give the printed speedup (default 6)")
    p.add_argument("--pair-seconds", type=_positive(float, "--pair-seconds"), default=8.0,
                   metavar="SECONDS",
                   help="timed training per standalone run, after its warm-up (default 8)")
    p.add_argument("--max-quality-drop", type=float, default=None, metavar="X",
                   help="how far the evaluate() metric may drop: allows structured pruning, and "
                        "replaces the default allowance for reduced precision (2%% of the metric)")
    p.add_argument("--json", action="store_true", help="print the result document as JSON")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="tune a model file and emit the fastest verified config",
                       description=__doc__)
    p.add_argument("model_file", metavar="FILE", help="your model file (see the README's contract)")
    p.add_argument("--trials", type=_positive(int, "--trials"), default=20,
                   help="measured trials in the search (default 20)")
    p.add_argument("--timeout", type=_positive(float, "--timeout"), default=None, metavar="SECONDS",
                   help="stop starting new trials after this many seconds")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default autotune-out/<model name>)")
    p.add_argument("--force", action="store_true",
                   help="write into an existing --out folder that autotune did not make")
    p.add_argument("--fix", action="append", default=[], metavar="KNOB=VALUE",
                   help="pin a knob, e.g. --fix batch_size=64 (repeatable)")
    p.add_argument("--exact", action="store_true",
                   help="keep everything in fp32 and unpruned (no reduced precision)")
    p.add_argument("--top", type=_positive(int, "--top"), default=2,
                   help="best-ranked candidates re-measured in verification, besides the first one's "
                        "layout contrast, the best of the other process layout and the best exact "
                        "and reduced-precision ones (default 2)")
    add_common(p)
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    reporter = Reporter(quiet=False)
    options = RunOptions(
        trials=args.trials, timeout_s=args.timeout, fixed=parse_fixes(args.fix), exact=args.exact,
        top=args.top, window_s=args.window, windows=args.windows,
        trial_timeout_s=args.trial_timeout, hang_timeout_s=args.hang_timeout, rounds=args.rounds,
        pairs=args.pairs, pair_seconds=args.pair_seconds, max_quality_drop=args.max_quality_drop)
    doc = tune(Path(args.model_file), out=args.out, options=options, reporter=reporter,
               force=args.force)
    if args.json:
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        reporter.summary(doc)
    return EXIT_VERIFIED if doc["verified"] else EXIT_NOT_VERIFIED
