"""``autotune run FILE``: probe, search, verify, emit."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from autotune.commands import add_common, positive, run_options
from autotune.options import SEARCH_SHARE, STORAGE_ENV, RunOptions, parse_batch_range, parse_size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="tune a model file and emit the fastest verified config",
                       description=__doc__)
    p.add_argument("model_file", metavar="FILE", help="your model file (see the README's contract)")
    p.add_argument("--trials", type=positive(int, "--trials"), default=RunOptions.trials,
                   help=f"measured trials in the search (default {RunOptions.trials})")
    p.add_argument("--timeout", type=positive(float, "--timeout"), default=RunOptions.timeout_s,
                   metavar="SECONDS",
                   help="bound the whole run, verification included: the search starts no trial "
                        f"after {SEARCH_SHARE * 100:.0f}%% of it, and verification's stages are fitted to the rest")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default autotune-out/<model name>)")
    p.add_argument("--force", action="store_true",
                   help="write into an existing --out folder that autotune did not make")
    p.add_argument("--fix", action="append", default=[], metavar="KNOB=VALUE",
                   help="pin a knob, e.g. --fix batch_size=64 (repeatable)")
    p.add_argument("--exact", action="store_true",
                   help="keep everything in fp32 and unpruned (no reduced precision)")
    p.add_argument("--top", type=positive(int, "--top"), default=RunOptions.top,
                   help="best-ranked candidates re-measured in verification, besides the first one's "
                        "layout contrast, the best of the other process layout and the best exact "
                        f"and reduced-precision ones (default {RunOptions.top})")
    p.add_argument("--batch-range", default=None, metavar="LOW-HIGH",
                   help="the global batch sizes the search may try, e.g. 16-1024: their powers of two and "
                        "both ends (default: a quarter to eight times the model file's batch_size)")
    p.add_argument("--scale-lr", default=RunOptions.scale_lr, metavar="{none,linear,sqrt}",
                   help="how the learning rate follows a tuned batch size unlike the model file's: "
                        "linear multiplies it by the tuned batch over yours, sqrt by that ratio's square "
                        "root, in every trial, the verification and the emitted script "
                        f"(default {RunOptions.scale_lr}: unchanged)")
    p.add_argument("--memory-limit", default=None, metavar="SIZE",
                   help="the most memory one rank may hold, e.g. 6GiB: host memory per process on CPU, "
                        "memory per GPU on CUDA; a configuration over it is not chosen, and one that "
                        "runs out of memory is tried again with activation checkpointing, gradient "
                        "accumulation or sharding (default: what the machine has, less a margin)")
    p.add_argument("--path", action="store_true",
                   help="also measure the path from the baseline to the winner, one knob added at a "
                        "time (the steps multiply to the whole speedup); as many processes again as "
                        "the ablation's knob-by-knob measurement")
    p.add_argument("--no-profile", action="store_true",
                   help="skip the step profile: one window of the emitted script under torch.profiler, "
                        "a few seconds after verification, that says where its step goes")
    planned = p.add_argument_group(
        "the run you plan",
        "Rank configurations by the predicted wall time of that run, one-time costs (compiling, "
        "warm-up, DataLoader start) included, instead of by steady throughput; give one of them.")
    planned.add_argument("--train-steps", type=positive(int, "--train-steps"), default=RunOptions.train_steps,
                         metavar="N", help="steps of your batch size (default: none, steady throughput)")
    planned.add_argument("--epochs", type=positive(int, "--epochs"), default=RunOptions.epochs, metavar="E",
                         help="passes over the data set (default: none, steady throughput)")
    shared = p.add_argument_group(
        "a study shared by several machines",
        "Each machine runs the same command with the same --storage and --study: they share one "
        "budget, and one of them verifies the result for all.")
    shared.add_argument("--storage", default=None, metavar="URL",
                        help="the study's PostgreSQL database, e.g. postgresql://USER:PASSWORD@HOST/DB "
                             f"(default: ${STORAGE_ENV}, else a journal file in the output folder); "
                             "needs pip install 'autotune[postgres]'")
    shared.add_argument("--study", default=None, metavar="NAME",
                        help="the study's name (default: the model file's name and the machine's fingerprint)")
    shared.add_argument("--heartbeat", type=positive(int, "--heartbeat"), default=RunOptions.heartbeat_s,
                        metavar="SECONDS",
                        help="how often a worker's running trial says it is alive; one silent for 3x that "
                             f"is failed and measured again (default {RunOptions.heartbeat_s})")
    shared.add_argument("--verify-wait", type=positive(float, "--verify-wait"), default=RunOptions.verify_wait_s,
                        metavar="SECONDS",
                        help="how long a worker waits for another one's verification "
                             f"(default {RunOptions.verify_wait_s:.0f})")
    add_common(p)
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from autotune.pipeline import EXIT_NOT_VERIFIED, EXIT_VERIFIED, output_folder, tune
    from autotune.report.console import Reporter
    from autotune.space import parse_fixes

    reporter = Reporter(quiet=args.quiet, verbose=args.verbose)
    options = run_options(args, trials=args.trials, timeout_s=args.timeout,
                          fixed=parse_fixes(args.fix), exact=args.exact, top=args.top, path=args.path,
                          train_steps=args.train_steps, epochs=args.epochs,
                          storage=args.storage or os.environ.get(STORAGE_ENV) or None, study=args.study,
                          heartbeat_s=args.heartbeat, verify_wait_s=args.verify_wait,
                          memory_limit_mb=parse_size(args.memory_limit) if args.memory_limit else None,
                          batch_range=parse_batch_range(args.batch_range) if args.batch_range else None,
                          scale_lr=args.scale_lr, profile=not args.no_profile)
    out = output_folder(Path(args.model_file), args.out)
    doc = tune(Path(args.model_file), out=out, options=options, reporter=reporter, force=args.force)
    if args.json:
        json.dump(doc.to_json(), sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        reporter.summary(doc, out)
    return EXIT_VERIFIED if doc.verified else EXIT_NOT_VERIFIED
