"""The package's shape: every module small enough to read, no import circle.

A function-local import counts: it hides a circle, it does not remove it. So does one under
``if TYPE_CHECKING:``: it does not run, but a reader following the types meets the circle."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "autotune"
MAX_LINES = 450


def modules() -> dict[str, Path]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The autotune modules ``name`` imports, anywhere in its text."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        out.update(t for t in targets if t in known and t != name)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_is_longer_than_a_reader_can_hold():
    long = {name: n for name, path in modules().items()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines: {long}"


def test_no_import_circle():
    found = modules()
    # a package's __init__ is imported with each of its modules: that edge is not a circle
    graph = {name: {m for m in imports(name, path, set(found)) if not name.startswith(m + ".")}
             for name, path in found.items()}
    assert circles(graph) == []


@pytest.mark.parametrize("text, expected", [
    ("a->b b->a", [["a", "b"]]),
    ("a->b b->c", []),
    ("a->b b->c c->a d->a", [["a", "b", "c"]]),
])
def test_circles_finds_what_it_should(text, expected):
    graph: dict[str, set[str]] = {}
    for edge in text.split():
        src, dst = edge.split("->")
        graph.setdefault(src, set()).add(dst)
        graph.setdefault(dst, set())
    assert circles(graph) == expected


# The stages in the order a run takes them: a folder may import from its own stage or an
# earlier one, never a later one (the trials do not reach into what is emitted after them).
LOWER_STAGES = ("runtime", "probes", "trials")
LATER_STAGES = ("search", "verify", "emit", "document", "report", "commands")


def test_the_lower_stages_import_nothing_of_the_later_ones():
    found = modules()
    known = set(found)
    reaching = sorted(f"{name} imports {target}" for name, path in found.items()
                      if name.split(".")[1:2] and name.split(".")[1] in LOWER_STAGES
                      for target in imports(name, path, known)
                      if target.split(".")[1:2] and target.split(".")[1] in LATER_STAGES)
    assert not reaching, reaching
