"""What every emitted ``run_tuned.py`` (one per way in, in ``autotune/templates/``) takes on its
command line, and the script it runs: its settings (``run_tuned.json`` beside it) read, its own
options parsed, the arguments after ``--`` kept for the script. Copied into ``tuned_runtime/``;
it imports nothing of autotune."""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import Any

SETTINGS = "run_tuned.json"
WARM_STEPS = 3  # steps before a timed run's clock starts: the first carries compilation and lazy setup


def parse(here: str, argv: Sequence[str]) -> tuple[dict[str, Any], argparse.Namespace, list[str] | None]:
    """The settings in ``here``, ``run_tuned.py``'s options from ``argv`` (``script``: the user's
    script, found), and the arguments after ``--`` (None: none given)."""
    with open(os.path.join(here, SETTINGS)) as f:
        settings = json.load(f)
    parser = argparse.ArgumentParser(description=settings.get("description"))
    parser.add_argument("--script", default=None, help="your script (default: the one autotune tuned; or SCRIPT=...)")
    parser.add_argument("--as-written", action="store_true", help="run your script as it is (the baseline)")
    parser.add_argument("--max-steps", type=int, default=None, help="train this many steps (a timed run)")
    parser.add_argument("--report", default=None, help="write the timed run's samples per second here (JSON)")
    parser.add_argument("--start-after", default=None, metavar="FILE",
                        help="set up, then wait until FILE exists before the first step")
    # what autotune's timed runs pass to every launcher: a timed run saves and evaluates nothing
    parser.add_argument("--no-checkpoint", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-evaluate", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--log-every", type=int, default=None, help=argparse.SUPPRESS)
    argv = list(argv)
    ours, rest = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, None)
    args = parser.parse_args(ours)
    args.script = _script(settings, args.script, here)
    return settings, args, rest


def _script(settings: dict[str, Any], given: str | None, here: str) -> str:
    """The user's script: --script or SCRIPT=..., else where it lies relative to ``here``, else
    where it was when tuned."""
    given = given or os.environ.get("SCRIPT")
    if given:
        return os.path.abspath(given)
    relative = os.path.normpath(os.path.join(here, settings["script"]))
    return relative if os.path.exists(relative) else str(settings["script_tuned"])
