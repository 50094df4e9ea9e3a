"""Errors shown to the user as one short message, never as a tuner traceback."""
from __future__ import annotations

import dataclasses


class AutotuneError(Exception):
    """An error whose message is meant for the user as it stands."""

    exit_code = 2


class ContractError(AutotuneError):
    """The user's model file does not follow the contract."""


class UsageError(AutotuneError):
    """A command-line value is wrong."""


class NotVerified(AutotuneError):
    """No configuration could be verified (e.g. the baseline itself fails)."""

    exit_code = 3


@dataclasses.dataclass(frozen=True)
class ErrorDocument:
    """What any command prints on stdout instead of its document when it fails under --json;
    the exit code is the process's."""

    error: str
    exit_code: int
    command: str
