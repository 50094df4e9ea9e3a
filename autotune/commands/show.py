"""``autotune show OUTDIR``: the answer of an earlier run, as the run ended with it; with
``--details``, everything it found, and what it means."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from autotune.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("show", help="summarise the result in an output folder", description=__doc__)
    p.add_argument("out", type=Path, metavar="OUTDIR")
    p.add_argument("--json", action="store_true", help="print best_config.json")
    p.add_argument("--details", action="store_true",
                   help="everything the run found: every knob, what the figure covers, the evidence, "
                        "the knobs not searched (the summary at the end of a run is the first screen of it)")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from autotune.report.advice import advise
    from autotune.report.console import Reporter
    from autotune.result import read_document
    from autotune.search.study import load_study

    doc = read_document(args.out)
    if args.json:
        print(json.dumps(doc.to_json(), indent=2))
        return 0
    reporter = Reporter(live=False)
    folder = args.out if args.out.is_dir() else args.out.parent
    if not args.details:
        reporter.summary(doc, folder)
        return 0
    reporter.details(doc, folder)
    try:
        study = load_study(args.out, model_file=doc.model_file, fingerprint_id=doc.fingerprint_id)
    except UsageError as exc:  # the summary stands without the search's trials
        reporter.warn(str(exc))
        study = None
    print()
    for line in advise(doc, study=study, in_summary=True):
        print(line)
    return 0
