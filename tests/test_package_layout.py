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


# The package's parts from the bottom up: a part may import from the levels below its own,
# never from its own level or one above. The stages keep the order a run takes them
# (runtime < probes < trials < space, task < document < search < verify < emit < report <
# pipeline, commands); the modules shared by stages sit below those that use them. A new
# folder or top-level module has to be placed here before its first test passes.
LEVELS: tuple[tuple[str, ...], ...] = (
    ("runtime", "errors", "templates"),  # the trial process's own code; what everything raises
    ("config", "schemas", "outdir", "user_file"),  # schemas: documents read and written by type
    ("probes", "autotune", "options"),  # the machine; the package's front door; the options a user gives
    ("trials",),
    ("space", "task"),
    ("document", "workbench"),  # the documents' types; what every stage works with
    ("sections",),  # the options as the stages take them
    ("harness",),  # the probe and the trial runner a run and a re-verification set up
    ("search",),
    ("verify",),
    ("emit",),  # the outputs, and the run document assembled from the stages' results
    ("result",),  # an earlier run's outputs, read back
    ("report",),
    ("pipeline", "reverify"),
    ("api", "commands"),
    ("cli",),
    ("__main__",),
)
# Imports allowed against LEVELS, each with its reason: (importing part, imported part) -> why.
AGAINST_THE_ORDER: dict[tuple[str, str], str] = {}


def part(name: str) -> str:
    """The folder or top-level module a module belongs to; the package itself for its __init__."""
    pieces = name.split(".")
    return pieces[1] if len(pieces) > 1 else pieces[0]


def level_of() -> dict[str, int]:
    return {p: i for i, parts in enumerate(LEVELS) for p in parts}


def test_every_part_of_the_package_has_its_level():
    placed = level_of()
    assert sorted({part(name) for name in modules()} - set(placed)) == []


def reaching(found: dict[str, Path], levels: dict[str, int]) -> list[str]:
    known = set(found)
    return sorted(f"{name} imports {target}" for name, path in found.items()
                  for target in imports(name, path, known)
                  if part(target) != part(name) and levels[part(target)] >= levels[part(name)]
                  and (part(name), part(target)) not in AGAINST_THE_ORDER)


def test_every_import_points_down_the_levels():
    assert reaching(modules(), level_of()) == []


def test_the_levels_would_catch_an_import_up_the_order(tmp_path):
    """The check itself: a trial module importing the search, or the search the report, is named."""
    fake = {"autotune.trials.x": tmp_path / "x.py", "autotune.search.y": tmp_path / "y.py",
            "autotune.report.z": tmp_path / "z.py"}
    fake["autotune.trials.x"].write_text("from autotune.search.y import thing\n")
    fake["autotune.search.y"].write_text("def f():\n    from autotune.report import z\n")
    fake["autotune.report.z"].write_text("from autotune.trials.x import other\n")
    assert reaching(fake, level_of()) == ["autotune.search.y imports autotune.report.z",
                                          "autotune.trials.x imports autotune.search.y"]


def test_no_two_parts_import_each_other():
    found = modules()
    known = set(found)
    edges = {(part(name), part(target)) for name, path in found.items()
             for target in imports(name, path, known) if part(target) != part(name)}
    assert sorted(f"{a} <-> {b}" for a, b in edges if (b, a) in edges and a < b) == []


def test_the_exceptions_are_few_and_each_has_its_reason():
    assert len(AGAINST_THE_ORDER) <= 3 and all(why.strip() for why in AGAINST_THE_ORDER.values())
