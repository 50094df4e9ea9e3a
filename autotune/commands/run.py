"""``autotune run FILE``: probe, search, verify, emit."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from autotune.commands import add_options, add_output, run_options


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="tune a model file and emit the fastest verified config",
                       description=__doc__, usage="autotune run FILE [OPTIONS] [-- SCRIPT ARGS]",
                       epilog="After --: the arguments your script runs with, as `python FILE ARGS` "
                              "takes them (autotune run train.py -- --epochs 3).")
    p.add_argument("model_file", metavar="FILE",
                   help="your training script (a plain PyTorch loop, a Hugging Face Trainer or Lightning script), "
                        "or a model file (see the README's contract)")
    p.set_defaults(script_args=[])  # what follows `--` (cli.main): the script's own arguments
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default autotune-out/<model name>)")
    p.add_argument("--force", action="store_true",
                   help="write into an existing --out folder that autotune did not make")
    add_options(p)  # every field of RunOptions
    add_output(p)
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from autotune.pipeline import EXIT_NOT_VERIFIED, EXIT_VERIFIED, output_folder, tune
    from autotune.report.console import Reporter

    # the live panel where stderr is a terminal; with --json, the lines a log reads
    reporter = Reporter(quiet=args.quiet, verbose=args.verbose, live=False if args.json else None)
    options = run_options(args)
    out = output_folder(Path(args.model_file), args.out)
    try:
        doc = tune(Path(args.model_file), out=out, options=options, reporter=reporter, force=args.force,
                   script_args=tuple(args.script_args))
    finally:
        reporter.close()  # before an error's message, too
    if args.json:
        json.dump(doc.to_json(), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        reporter.summary(doc, out)
    return EXIT_VERIFIED if doc.verified else EXIT_NOT_VERIFIED
