"""The subcommands, one module each; the options they share are defined here."""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from autotune.options import RunOptions


def positive(kind: type, name: str) -> Callable[[str], Any]:
    """An argparse type: a positive number of ``kind``, named in the error."""
    def parse(text: str) -> Any:
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
    p.add_argument("--window", type=positive(float, "--window"), default=RunOptions.window_s,
                   help=f"seconds per measurement window (default {RunOptions.window_s})")
    p.add_argument("--windows", type=positive(int, "--windows"), default=RunOptions.windows,
                   help=f"measurement windows per trial (default {RunOptions.windows})")
    p.add_argument("--trial-timeout", type=positive(float, "--trial-timeout"), default=RunOptions.trial_timeout_s,
                   help=f"seconds before a trial is killed (default {RunOptions.trial_timeout_s:.0f})")
    p.add_argument("--hang-timeout", type=positive(float, "--hang-timeout"), default=RunOptions.hang_timeout_s,
                   metavar="SECONDS",
                   help="seconds without a finished step before a trial counts as hung (default "
                        f"{RunOptions.hang_timeout_s:.0f}; five of the trial's own steps where a step "
                        "takes longer); setup may take 5x the model file's check, at least 60 s")
    p.add_argument("--rounds", type=positive(int, "--rounds"), default=RunOptions.rounds,
                   help="the most rounds of side-by-side windows that rank the candidates in "
                        f"verification; they stop once the ranking is settled (default {RunOptions.rounds})")
    p.add_argument("--pairs", type=positive(int, "--pairs"), default=RunOptions.pairs,
                   help="the most pairs of standalone runs (the emitted launch.sh and the baseline's "
                        "script, each alone) that give the printed speedup; they stop from the 5th once "
                        f"it is settled and as narrow as the machine's noise allows (default {RunOptions.pairs})")
    p.add_argument("--pair-seconds", type=positive(float, "--pair-seconds"), default=RunOptions.pair_seconds,
                   metavar="SECONDS",
                   help=f"timed training per standalone run, after its warm-up (default {RunOptions.pair_seconds:.0f})")
    p.add_argument("--max-quality-drop", type=float, default=RunOptions.max_quality_drop, metavar="X",
                   help="how far the evaluate() metric may drop: allows structured pruning, and "
                        "replaces the default allowance for reduced precision (2%% of the metric)")
    p.add_argument("--fresh-trials", action="store_true",
                   help="measure every configuration in a fresh process (by default configurations "
                        "that share the process knobs run one after another in one warm process)")
    p.add_argument("--json", action="store_true", help="print the result document as JSON")
    loud = p.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    loud.add_argument("-v", "--verbose", action="store_true",
                      help="also print every measurement window")


def run_options(args: argparse.Namespace, **extra: Any) -> RunOptions:
    """The measuring options of ``add_common`` as RunOptions, plus the command's own."""
    return RunOptions(window_s=args.window, windows=args.windows,
                      trial_timeout_s=args.trial_timeout, hang_timeout_s=args.hang_timeout,
                      rounds=args.rounds, pairs=args.pairs, pair_seconds=args.pair_seconds,
                      max_quality_drop=args.max_quality_drop, warm_trials=not args.fresh_trials,
                      **extra)
