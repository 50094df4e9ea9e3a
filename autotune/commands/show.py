"""``autotune show OUTDIR``: the result of an earlier run."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from autotune.emit import CONFIG_NAME
from autotune.errors import UsageError
from autotune.report import Reporter


def read_result(out: Path) -> dict:
    path = out / CONFIG_NAME if out.is_dir() else out
    if not path.exists():
        raise UsageError(f"{path}: no such file. Give the output folder of an `autotune run`.")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not valid JSON ({exc}).") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("show", help="summarise the result in an output folder", description=__doc__)
    p.add_argument("out", type=Path, metavar="OUTDIR")
    p.add_argument("--json", action="store_true", help="print best_config.json")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    doc = read_result(args.out)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        Reporter().summary(doc)
    return 0
