"""``autotune dashboard OUTDIR``: the run's Optuna study in optuna-dashboard, in a browser.

Served on 127.0.0.1 (this machine only) unless ``--host`` says otherwise. Needs the
optional extra: ``pip install 'autotune[dashboard]'``.
"""
from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from autotune.commands import positive
from autotune.errors import UsageError
from autotune.options import STORAGE_ENV


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dashboard", help="open the run's study in optuna-dashboard",
                       description=__doc__)
    p.add_argument("out", type=Path, metavar="OUTDIR")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=positive(int, "--port"), default=8080, help="default 8080")
    p.add_argument("--storage", default=None, metavar="URL",
                   help=f"a shared study's database (default ${STORAGE_ENV}): its password is not "
                        "kept in the output folder")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    import optuna.storages

    from autotune.search.study import open_database, shown_url, storage_path

    url = args.storage or os.environ.get(STORAGE_ENV)
    journal = storage_path(args.out)
    if not url and not journal.exists():
        shared = _shared_storage(args.out)
        raise UsageError(f"{journal}: no study here. Give the output folder of an `autotune run`"
                         + (f"; this run's study is shared in {shared}: give its URL with --storage "
                            "(or $AUTOTUNE_STORAGE)" if shared else "."))
    try:
        import optuna_dashboard
    except ImportError:
        raise UsageError("optuna-dashboard is not installed: pip install 'autotune[dashboard]'") from None
    import optuna.storages.journal

    storage: optuna.storages.BaseStorage
    if url:
        storage, shown = open_database(url), shown_url(url)
    else:
        storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
        shown = str(journal)
    print(f"serving {shown} on http://{args.host}:{args.port}/ (Ctrl-C stops it)", flush=True)
    optuna_dashboard.run_server(storage, host=args.host, port=args.port)
    return 0


def _shared_storage(out: Path) -> str | None:
    """Where the run in ``out`` kept its study, if in a database (the URL as written: masked)."""
    try:
        return json.loads((out / "best_config.json").read_text())["search"].get("storage")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
