"""``autotune verify OUTDIR``: re-run the verification of a tuned configuration, here.

Useful later, or on another machine: it warns when this machine's fingerprint
differs from the one the configuration was tuned on, and says when the speedup
measured now lies outside the interval printed when it was tuned.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from autotune.commands import add_options, add_output, run_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="re-check a tuned configuration on this machine",
                       description=__doc__)
    p.add_argument("out", type=Path, metavar="OUTDIR")
    p.add_argument("--model-file", type=Path, default=None,
                   help="the model file, where the folder no longer finds it (a copy on another "
                        "machine): default, relative to OUTDIR as when tuned, else where it was tuned")
    add_options(p, verify=True)  # the fields of RunOptions marked verify: how re-runs are measured
    add_output(p)
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from autotune.pipeline import EXIT_NOT_VERIFIED, EXIT_VERIFIED
    from autotune.report.console import Reporter
    from autotune.reverify import reverify

    reporter = Reporter(quiet=args.quiet, verbose=args.verbose, live=False if args.json else None)
    try:
        result = reverify(args.out, options=run_options(args), reporter=reporter, model_file=args.model_file)
    finally:
        reporter.close()  # the verdict below in lines
    now = result.speedup
    if args.json:
        print(json.dumps(result.to_json(), indent=2))
    elif result.verified and now is not None:  # verified: its pairs ran
        shown = now.interval
        lead = (f"{now.lower_bound:.2f}x or more in {shown.level:.0%} of re-runs, median "
                if now.lower_bound else "")
        # the configuration the run kept, not emitted, was never verified before
        said = "verified again" if result.kept is None else f"the kept configuration ({result.kept}) verified here"
        reporter.info(f"{said}: speedup {lead}{shown.ratio:.2f}x over {now.pairs} pairs of "
                      f"standalone runs (a re-run lands in {shown.low:.2f}-"
                      f"{shown.high:.2f}x, {shown.level:.0%})")
    else:
        reporter.info(f"not verified here: {result.reason}")
    if result.outside_printed_interval:
        reporter.warn(result.outside_printed_interval)
    return EXIT_VERIFIED if result.verified else EXIT_NOT_VERIFIED
