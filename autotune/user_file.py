"""The user's model file in the contract's child process: importing it and calling its
functions, each error shown as theirs (their own frames of the traceback) in a
ContractError that names what raised it."""
from __future__ import annotations

import ast
import dataclasses
import os
import traceback
from collections.abc import Callable
from typing import Any

from autotune.errors import ContractError


def _user_frames(tb: str, path: str) -> str:
    """The user's own part of a traceback: from their file's first frame on."""
    lines = tb.strip().splitlines()
    for i, line in enumerate(lines):
        if path in line:
            return "\n".join(["Traceback (most recent call last):", *lines[i:]][-12:])
    return "\n".join(lines[-6:])


@dataclasses.dataclass(frozen=True)
class UserFile:
    """The model file being checked: its path and the name messages show for it."""

    path: str
    shown: str

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call the user's ``fn``; an error it raises becomes a ContractError naming
        ``what`` and showing the user's own frames of the traceback."""
        try:
            return fn(*args)
        except (Exception, SystemExit):  # the user's error, shown as theirs
            raise ContractError(
                f"{self.shown}: {what} raised an error:\n"
                f"{_user_frames(traceback.format_exc(), self.path)}"
            ) from None


def import_user_file(file: UserFile) -> Any:
    """Import the model file; an error or sys.exit() at import becomes a ContractError."""
    from autotune.runtime.session import load_user_module

    try:
        return load_user_module(file.path)
    except (Exception, SystemExit):  # sys.exit() at import, too
        raise ContractError(
            f"{file.shown}: importing the file raised an error:\n"
            f"{_user_frames(traceback.format_exc(), file.path)}"
        ) from None


def in_loop(tree: ast.AST, line: int) -> bool:
    """Whether ``line`` of the source ``tree`` lies in a ``for`` or ``while`` loop (a script's
    ``train()`` or ``fit()`` there trains more than once)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor)):
            end = getattr(node, "end_lineno", node.lineno)
            if node.lineno <= line <= (end or node.lineno):
                return True
    return False


def own_frames(exc: BaseException, path: str) -> str:
    """``exc``'s traceback as the user reads it: the frames of files in their script's folder
    (not installed packages'), then what was raised; a library's deep stack left out."""
    folder = os.path.dirname(os.path.abspath(path)) + os.sep
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if os.path.abspath(f.filename).startswith(folder) and "site-packages" not in f.filename]
    shown = "".join(traceback.format_list(frames[-8:])).rstrip()
    last = "".join(traceback.format_exception_only(exc)).rstrip()
    return "\n".join(["Traceback (most recent call last):", shown, last] if shown else [last])
