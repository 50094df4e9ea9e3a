"""``autotune dashboard OUTDIR``: the run's Optuna study in optuna-dashboard, in a browser.

Served on 127.0.0.1 (this machine only) unless ``--host`` says otherwise. Needs the
optional extra: ``pip install 'autotune[dashboard]'``.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from autotune.commands import positive
from autotune.errors import UsageError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dashboard", help="open the run's study in optuna-dashboard",
                       description=__doc__)
    p.add_argument("out", type=Path, metavar="OUTDIR")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=positive(int, "--port"), default=8080, help="default 8080")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from autotune.search.study import storage_path

    journal = storage_path(args.out)
    if not journal.exists():
        raise UsageError(f"{journal}: no study here. Give the output folder of an `autotune run`.")
    try:
        import optuna_dashboard
    except ImportError:
        raise UsageError("optuna-dashboard is not installed: pip install 'autotune[dashboard]'") from None
    import optuna.storages.journal

    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    print(f"serving {journal} on http://{args.host}:{args.port}/ (Ctrl-C stops it)", flush=True)
    optuna_dashboard.run_server(storage, host=args.host, port=args.port)
    return 0
