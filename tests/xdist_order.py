"""The order pytest-xdist hands tests out in (README: ``pytest -n 2 --dist loadgroup``), a
plugin that tests/conftest.py loads.

With `--dist loadgroup` a worker asks for the next unit (a group, or one test) only when it
is almost out of work, so what runs last decides how long one worker idles while the other
finishes. Units go out longest first (a group as one unit, its tests in file order, so its
module fixtures still run once): the long groups and end-to-end tests start while the
short tests remain to fill both workers to the end. A test's length is guessed from its
`slow` mark, which every test that starts processes carries.

The tests that run alone (``runs_alone``) go out before all others. Each keeps the other
worker idle while it runs, and where it comes up mid-run it first waits out the other
worker's test in progress, idle too (13 and 27 s for the two of them in one run of the
suite on 2 cores). Handed out first, one to each worker, the second waits only for the first.
"""
from __future__ import annotations

import os

import pytest

_WORKER = os.environ.get("PYTEST_XDIST_WORKER")

_SLOW_WEIGHT = 10


def _group(item: pytest.Item) -> str | None:
    mark = item.get_closest_marker("xdist_group")
    if mark is None:
        return None
    return str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))


def runs_alone(item: pytest.Item) -> bool:
    """Whether ``item`` keeps the other worker waiting (tests/conftest.py): marked `alone`, and
    not skipped by its marks. A skipped one runs nothing, and its exclusive lock would still
    wait out the other worker's test in progress. Only a condition already decided (a bool)
    is read here; pytest evaluates a string condition later, so such a test waits as before."""
    if item.get_closest_marker("alone") is None:
        return False
    if item.get_closest_marker("skip") is not None:
        return False
    # pytest skips where any of a mark's conditions holds
    return not any(any(c is True for c in mark.args) or mark.kwargs.get("condition") is True
                   for mark in item.iter_markers("skipif"))


def pytest_configure(config: pytest.Config) -> None:
    # xdist would otherwise sort the units by how many tests they hold, not by how long they run
    if config.getoption("dist", None) == "loadgroup":
        config.option.loadscopereorder = False


def _keep_group(item: pytest.Item, group: str) -> None:
    """Name ``item`` ``<nodeid>@<group>``, the name by which the controller's loadgroup
    scheduling sends a group's tests to one worker. pytest-xdist (3.8) names it so by
    setting ``item._nodeid``, which pytest 9.2 no longer reads (a node's id is ``item._id``):
    without this every test of a group would be scheduled on its own, and a group's module
    fixtures (a PostgreSQL server, a killed and resumed run) would run in both workers."""
    wanted = f"{item.nodeid}@{group}"
    if hasattr(item, "_id"):
        from _pytest.nodeid import NodeId

        item._id = NodeId.parse(wanted)
    if item.nodeid != wanted:
        raise pytest.UsageError(
            f"cannot keep {item.nodeid} in its xdist_group {group!r}: this pytest names tests in a way "
            "tests/conftest.py does not know; run the suite without --dist loadgroup")


@pytest.hookimpl(trylast=True)  # after pytest-xdist's own naming of grouped tests
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _WORKER:  # one process runs everything in file order
        return
    grouping = getattr(config.option, "loadgroup", False)
    unit_of: dict[int, str] = {}
    for item in items:
        group = _group(item)
        if grouping and group is not None and not item.nodeid.endswith(f"@{group}"):
            _keep_group(item, group)
        unit_of[id(item)] = item.nodeid if group is None else group
    weight: dict[str, int] = {}
    alone = {unit_of[id(item)] for item in items if runs_alone(item)}
    first_seen: dict[str, int] = {}
    for i, item in enumerate(items):
        unit = unit_of[id(item)]
        weight[unit] = weight.get(unit, 0) + (_SLOW_WEIGHT if item.get_closest_marker("slow") else 1)
        first_seen.setdefault(unit, i)
    items.sort(key=lambda item: (unit_of[id(item)] not in alone, -weight[unit_of[id(item)]],
                                 first_seen[unit_of[id(item)]]))
