"""``autotune init FILE``: write a commented model-file template to start from."""
from __future__ import annotations

import argparse
from pathlib import Path

from autotune.errors import UsageError

TEMPLATE = Path(__file__).resolve().parent.parent / "templates" / "model_file.py"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("init", help="write a model-file template to fill in", description=__doc__)
    p.add_argument("file", type=Path, metavar="FILE", help="where to write it (e.g. my_model.py)")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    path: Path = args.file
    if path.suffix != ".py":
        raise UsageError(f"{path}: a model file is a Python file: give a name ending in .py")
    if path.exists():
        raise UsageError(f"{path} exists: autotune init never overwrites a file. Give a new name.")
    if not path.parent.is_dir():
        raise UsageError(f"{path.parent}: no such folder")
    path.write_text(TEMPLATE.read_text())
    print(f"wrote {path}: fill in build_model and build_dataset, then run `autotune run {path}`")
    return 0
