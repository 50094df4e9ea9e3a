"""The tuned configuration as an edit of the user's own training script.

autotune hands a plain PyTorch script back changed, not rewritten: the DataLoader call gets
keyword arguments and statements follow one of the script's statements. The edits are JSON
data, and this module is the one place that applies them: the trials run `compiled(...)` in
place of the script, and the user gets `diff(...)` of the same edits, so what was measured is
what the user applies. It imports the standard library only, as it is copied verbatim into
the output folder next to the edits.

    edits = {"loader": {"line": 27, "kwargs": {"num_workers": "2", "pin_memory": "True"}},
             "after": {"line": 31, "statements": ["model.compile()"]}}
"""
from __future__ import annotations

import ast
import bisect
import difflib
import itertools
import re
import types
from collections.abc import Mapping, Sequence
from typing import Any

# torch.utils.data.DataLoader's parameters that may be passed by position, in order
POSITIONAL = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn",
              "pin_memory", "drop_last", "timeout", "worker_init_fn", "multiprocessing_context", "generator")
# Python's line breaks: str.splitlines also breaks at \f, \v, \x1c..., shifting ast's line numbers
_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")
# The rest of a line after the last argument of a call laid out one argument a line.
_TRAILING_COMMA = re.compile(r"\s*,\s*(#.*)?\s*")
_DIFF_LINE = re.compile(r"[^\n]*\n|[^\n]+")  # patch and git split lines at \n only

_Splice = tuple[int, int, str]  # start and end offsets into the source, and the text put there


class PatchError(ValueError):
    """The edits do not fit the script: no DataLoader call or no statement where they point."""


class _Source:
    def __init__(self, text: str) -> None:
        self.lines: list[str] = _LINE.findall(text)
        self.starts = list(itertools.accumulate(map(len, self.lines), initial=0))
        try:
            self.tree = ast.parse(text)
        except SyntaxError as e:
            raise PatchError(f"the script does not parse: {e}") from e

    def offset(self, lineno: int, col: int) -> int:
        """ast's (line, column) as an offset into the text: ast's columns count UTF-8 bytes."""
        return self.starts[lineno - 1] + len(self.before(lineno, col))

    def span(self, node: Any) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def line_of(self, offset: int) -> int:
        return bisect.bisect_right(self.starts, max(offset, 0))

    def before(self, lineno: int, col: int) -> str:
        return self.lines[lineno - 1].encode()[:col].decode()


def _ending(line: str) -> str:
    return line[len(line.rstrip("\r\n")):]


def _loader(src: _Source, line: int, kwargs: Mapping[str, str]) -> list[_Splice]:
    calls = [n for n in ast.walk(src.tree) if isinstance(n, ast.Call)
             and (n.func.id if isinstance(n.func, ast.Name) else getattr(n.func, "attr", None)) == "DataLoader"]
    here = [c for c in calls if c.lineno == line]
    if not here:
        where = ", ".join(str(n) for n in sorted({c.lineno for c in calls})) or "none"
        raise PatchError(f"line {line}: no DataLoader(...) call starts on this line (DataLoader calls: lines {where})")
    call = min(here, key=lambda c: c.col_offset)
    given = {k.arg: k.value for k in call.keywords if k.arg is not None}
    starred = [i for i, a in enumerate(call.args) if isinstance(a, ast.Starred)]
    splices: list[_Splice] = []
    added: list[str] = []
    for name, value in kwargs.items():
        node = given.get(name)
        if node is None and name in POSITIONAL:
            index = POSITIONAL.index(name)
            if starred and starred[0] <= index:
                raise PatchError(f"line {line}: DataLoader's *arguments may pass {name}; give it by keyword")
            node = call.args[index] if index < len(call.args) else None
        if node is None:
            added.append(f"{name}={value}")
        else:
            splices.append((*src.span(node), value))
    if added:
        splices.append(_append(src, call, added))
    return splices


def _append(src: _Source, call: ast.Call, added: list[str]) -> _Splice:
    """New keywords after the call's last argument, in the call's layout."""
    if not call.args and not call.keywords:
        at = src.span(call)[1] - 1  # before ")"
        return at, at, ", ".join(added)
    last: Any = max([*call.args, *call.keywords], key=lambda a: src.span(a)[1])
    line = src.lines[last.end_lineno - 1]
    rest = line.encode()[last.end_col_offset:].decode()
    indent = src.before(last.lineno, last.col_offset)
    if (call.end_lineno or 0) > last.end_lineno and not indent.strip() and _TRAILING_COMMA.fullmatch(rest):
        # one argument a line, each with its comma (black's layout): the new ones alike, so the
        # user's diff shows added lines only
        at = src.starts[last.end_lineno]
        newline = _ending(line) or "\n"
        return at, at, "".join(f"{indent}{a},{newline}" for a in added)
    at = src.offset(last.end_lineno, last.end_col_offset)
    return at, at, "".join(f", {a}" for a in added)


def _after(src: _Source, line: int, statements: Sequence[str]) -> _Splice:
    simple = [n for n in ast.walk(src.tree) if isinstance(n, ast.stmt) and not {"body", "cases"} & set(n._fields)]
    hit = [s for s in simple if s.lineno <= line <= (s.end_lineno or s.lineno)]
    if not hit:
        raise PatchError(f"line {line}: no simple statement (assignment, call...) spans this line to insert after")
    anchor = min(hit, key=lambda s: (s.lineno, s.col_offset))
    indent = src.before(anchor.lineno, anchor.col_offset)
    if indent.strip():
        # after `if x: y()` a statement at the line's indentation would run outside the `if`
        raise PatchError(f"line {line}: the statement shares its line with a compound statement's header")
    end = max(s.end_lineno or s.lineno for s in hit)
    # `a = (\n1); b = (\n2)`: a line may end inside the next statement after a semicolon
    while later := [s.end_lineno or 0 for s in simple if s.lineno <= end < (s.end_lineno or 0)]:
        end = max(later)
    last = src.lines[end - 1]
    newline = _ending(last) or _ending(src.lines[0]) or "\n"
    text = "".join(indent + part + newline for statement in statements for part in statement.splitlines())
    if not _ending(last):  # the script's last line, without a line break: so is the patched one
        text = newline + text[: -len(newline)]
    return src.starts[end], src.starts[end], text


def _apply(source: str, edits: Mapping[str, Any]) -> tuple[str, list[int]]:
    """The patched text and, for each of its lines, the original line it comes from."""
    if set(edits) - {"loader", "after"}:
        raise PatchError(f"unknown edits in {sorted(edits)}: only 'loader' and 'after' are known")
    loader, after = edits.get("loader"), edits.get("after")
    if not loader and not after:
        return source, list(range(1, len(_LINE.findall(source)) + 1))
    src = _Source(source)
    splices = _loader(src, int(loader["line"]), loader.get("kwargs") or {}) if loader else []
    if after and after.get("statements"):
        splices.append(_after(src, int(after["line"]), after["statements"]))
    # (text, offset, inserted): an inserted text's lines take the line it follows
    pieces: list[tuple[str, int, bool]] = []
    pos = 0
    for start, end, text in sorted(splices):
        pieces += [(source[pos:start], pos, False), (text, start - 1, True)]
        pos = end
    pieces.append((source[pos:], pos, False))
    origins: list[int] = []
    at_line_start = True
    for text, offset, inserted in pieces:
        for chunk in _LINE.findall(text):
            if at_line_start:
                origins.append(src.line_of(offset))
            if not inserted:
                offset += len(chunk)
            at_line_start = chunk[-1] in "\r\n"
    patched_text = "".join(p[0] for p in pieces)
    try:
        ast.parse(patched_text)
    except SyntaxError as e:
        raise PatchError(f"the patched script does not parse ({e}); the edits were {dict(edits)}") from e
    return patched_text, origins


def patched(source: str, edits: Mapping[str, Any]) -> str:
    """The script with the edits applied; `source` itself where they are empty."""
    return _apply(source, edits)[0]


def compiled(source: str, edits: Mapping[str, Any], filename: str) -> types.CodeType:
    """The patched script compiled as `filename` with the original script's line numbers, so that
    a trial's traceback names the user's lines; inserted statements carry the line they follow."""
    text, origins = _apply(source, edits)
    tree = ast.parse(text, filename)
    nodes: list[Any] = list(ast.walk(tree))
    for positioned in (n for n in nodes if "end_lineno" in n._attributes):
        first = origins[min(positioned.lineno, len(origins)) - 1]
        last = origins[min(positioned.end_lineno, len(origins)) - 1]
        if first == last and positioned.lineno != positioned.end_lineno:
            # columns of two lines made one: compile() refuses a range that ends before it starts
            positioned.end_col_offset = max(positioned.end_col_offset, positioned.col_offset)
        positioned.lineno, positioned.end_lineno = first, last
    # dont_inherit: this module's `from __future__ import annotations` is not the script's
    return compile(tree, filename, "exec", dont_inherit=True)


def diff(source: str, edits: Mapping[str, Any], name: str) -> str:
    """The edits as a diff for `patch -p1` or `git apply` in the folder of `name`; "" for no change."""
    new = patched(source, edits)
    if new == source:
        return ""
    lines = difflib.unified_diff(_DIFF_LINE.findall(source), _DIFF_LINE.findall(new), f"a/{name}", f"b/{name}", n=3)
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
