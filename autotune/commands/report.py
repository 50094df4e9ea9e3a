"""``autotune report OUTDIR``: (re)write report.md and report.html (plots under report/)
in the output folder of an earlier run."""
from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="write report.md and report.html into an output folder",
                       description=__doc__)
    p.add_argument("out", type=Path, metavar="OUTDIR")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from autotune.report.files import write_report

    for path in write_report(args.out):
        print(path)
    return 0
