"""``autotune show OUTDIR``: the result of an earlier run."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from autotune.report import Reporter
from autotune.result import read_document


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("show", help="summarise the result in an output folder", description=__doc__)
    p.add_argument("out", type=Path, metavar="OUTDIR")
    p.add_argument("--json", action="store_true", help="print best_config.json")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    doc = read_document(args.out)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        Reporter().summary(doc)
    return 0
