"""The subcommands, one module each; here, their flags built from ``RunOptions``' fields
(``autotune.options.Flag``) and read back into it, and the output flags they share."""
from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable
from typing import Any

from autotune.options import Flag, Group, RunOptions, flag_of


def positive(kind: type, name: str) -> Callable[[str], Any]:
    """An argparse type: a positive number of ``kind``, named in the error."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be positive, got {text}")
        return value
    return parse


def _flags(options: type[RunOptions], *, verify: bool) -> list[tuple[dataclasses.Field[Any], Flag]]:
    """The fields of ``options`` with a flag (those of ``autotune verify``: with ``verify``)."""
    return [(f, flag) for f in dataclasses.fields(options)
            if (flag := flag_of(f)) is not None and (flag.verify or not verify)]


def _parser_default(field: dataclasses.Field[Any], flag: Flag) -> Any:
    """What the namespace holds when the flag is not given: the field's default (help texts
    show it), or None where the text is parsed when the options are built."""
    if flag.parse is not None or flag.repeat or field.default is dataclasses.MISSING:
        return None
    return field.default


def add_options(p: argparse.ArgumentParser, *, options: type[RunOptions] = RunOptions,
                verify: bool = False) -> None:
    """One flag per field of ``options``, in the fields' order, each into the namespace
    under its field's name; with ``verify``, only those ``autotune verify`` shares."""
    groups: dict[Group, Any] = {}
    for field, flag in _flags(options, verify=verify):
        where: Any = p
        if flag.group is not None:
            if flag.group not in groups:
                groups[flag.group] = p.add_argument_group(flag.group.title, flag.group.description)
            where = groups[flag.group]
        default = _parser_default(field, flag)
        if isinstance(field.default, bool):  # a switch: the flag says the opposite of the default
            where.add_argument(flag.name, dest=field.name, help=flag.help, default=default,
                               action="store_false" if field.default else "store_true")
            continue
        number = flag.number
        where.add_argument(flag.name, dest=field.name, help=flag.help, default=default,
                           metavar=flag.metavar or flag.name.lstrip("-").replace("-", "_").upper(),
                           action="append" if flag.repeat else "store",
                           type=None if number is None else positive(number, flag.name) if flag.positive else number)


def add_output(p: argparse.ArgumentParser) -> None:
    """How run and verify print: the document as JSON, progress or not."""
    p.add_argument("--json", action="store_true", help="print the result document as JSON")
    loud = p.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true", help="no progress on stderr")
    loud.add_argument("-v", "--verbose", action="store_true",
                      help="also print every measurement window")


def run_options(args: argparse.Namespace, *, options: type[RunOptions] = RunOptions) -> RunOptions:
    """``options`` from the flags ``add_options`` put in ``args``; a field whose flag the
    command lacks, or that was not given, keeps its default."""
    given: dict[str, Any] = {}
    for field, flag in _flags(options, verify=False):
        value = getattr(args, field.name, None)
        if value == "" and _parser_default(field, flag) is None:
            value = None  # an empty text: as if not given
        if value is None and flag.env:
            value = os.environ.get(flag.env) or None
        if value is None:
            continue
        given[field.name] = flag.parse(value, flag.name) if flag.parse is not None else value
    return options(**given)
