"""The ``autotune`` command: one module per subcommand under autotune/commands."""
from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from autotune import __version__
from autotune.commands import dashboard, init, probe, report, run, show, verify
from autotune.errors import AutotuneError, ErrorDocument

if TYPE_CHECKING:
    from pydantic.json_schema import JsonSchemaValue

COMMANDS = (run, probe, show, report, verify, dashboard, init)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="autotune",
        description="Find the fastest verified training configuration for a PyTorch model "
                    "on this machine.",
        epilog="exit codes: 0 done (run/verify: a configuration was verified faster); "
               "2 a usage or model-file error, named on stderr; 3 nothing was verified faster "
               "than the baseline (the baseline is emitted) or the baseline itself failed; "
               "130 interrupted (run the same command again to resume).",
    )
    parser.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for command in COMMANDS:
        command.register(sub)
    return parser


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM cleans up like Ctrl-C: trials killed, study consistent


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _terminate)
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # `autotune run SCRIPT [OPTIONS] -- ARGS`: what follows the first -- is the script's own
    script_args: list[str] | None = None
    if "--" in argv:
        cut = argv.index("--")
        argv, script_args = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    if script_args is not None:
        if args.command != "run":
            parser.error(f"arguments after -- go to a Trainer script, which only `autotune run` takes "
                         f"(autotune {args.command} got {' '.join(script_args)})")
        args.script_args = script_args
    try:
        return int(args.handler(args) or 0)
    except AutotuneError as exc:
        if getattr(args, "json", False):  # a script reading stdout gets JSON either way
            from autotune.schemas import typed

            print(json.dumps(typed.written(ErrorDocument(error=str(exc), exit_code=exc.exit_code,
                                                         command=args.command))))
        print(f"autotune {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"\nautotune {args.command}: interrupted. Run the same command again to resume.",
              file=sys.stderr)
        return 130


def error_schema() -> JsonSchemaValue:
    """The JSON Schema of an error under --json, generated from its type (``ErrorDocument``)."""
    from autotune.schemas import typed

    generated = typed.schema(ErrorDocument)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "autotune/error.schema.json",
            "title": "an autotune error under --json",
            "description": "What any command prints on stdout instead of its document when it fails under --json; "
                           "the exit code is the process's. Generated from its type: python -c 'from "
                           "autotune.cli import write_schema; write_schema()'",
            "type": "object", "required": generated["required"], "properties": generated["properties"],
            "additionalProperties": False}


def write_schema() -> None:
    """Write ``error_schema()`` over the shipped schema file."""
    (Path(__file__).resolve().parent / "schemas" / "error.schema.json").write_text(
        json.dumps(error_schema(), indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
