"""Errors shown to the user as one short message, never as a tuner traceback."""
from __future__ import annotations


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
