"""The suite's own scheduling under pytest-xdist (tests/xdist_order.py): a group's tests
share one worker, so its module fixtures run once, and long units go out first."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

GROUPED = '''
import json, os, pytest

pytestmark = pytest.mark.xdist_group("together")


@pytest.fixture(scope="module")
def once(tmp_path_factory):
    return os.environ["PYTEST_XDIST_WORKER"]


@pytest.mark.parametrize("n", range(3))
def test_grouped(once, n):
    with open(os.environ["SEEN"], "a") as f:
        f.write(json.dumps({"test": f"grouped{n}", "worker": os.environ["PYTEST_XDIST_WORKER"],
                            "fixture_worker": once}) + "\\n")
'''

LOOSE = '''
import json, os, pytest


@pytest.mark.parametrize("n", range(2))
def test_fast(n):
    with open(os.environ["SEEN"], "a") as f:
        f.write(json.dumps({"test": f"fast{n}", "worker": os.environ["PYTEST_XDIST_WORKER"]}) + "\\n")


@pytest.mark.slow
def test_slow():
    with open(os.environ["SEEN"], "a") as f:
        f.write(json.dumps({"test": "slow", "worker": os.environ["PYTEST_XDIST_WORKER"]}) + "\\n")
'''

# two slow tests ahead of it: in their order it would be third, after one on each worker
LAST_ALONE = LOOSE + '''

@pytest.mark.slow
def test_slow_too():
    with open(os.environ["SEEN"], "a") as f:
        f.write(json.dumps({"test": "slow_too", "worker": os.environ["PYTEST_XDIST_WORKER"]}) + "\\n")


@pytest.mark.slow
@pytest.mark.alone
def test_alone():
    with open(os.environ["SEEN"], "a") as f:
        f.write(json.dumps({"test": "alone", "worker": os.environ["PYTEST_XDIST_WORKER"]}) + "\\n")
'''


def run_suite(folder: Path, *files: tuple[str, str]) -> list[dict]:
    """Run ``files`` (name, source) as a suite of their own with ``pytest -n 2 --dist
    loadgroup`` and the hooks tests/conftest.py uses; what each test recorded, in order."""
    (folder / "conftest.py").write_text(
        "from xdist_order import pytest_collection_modifyitems, pytest_configure  # noqa: F401\n")
    (folder / "pytest.ini").write_text("[pytest]\nmarkers =\n  slow: slow\n  alone: alone\n")
    for name, source in files:
        (folder / name).write_text(source)
    seen = folder / "seen.jsonl"
    env = {**os.environ, "SEEN": str(seen), "PYTHONPATH": str(TESTS)}
    env.pop("PYTEST_XDIST_WORKER", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2",
                           "--dist", "loadgroup", "-q", str(folder)],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in seen.read_text().splitlines()]


def worker_of(test: str, runs: list[dict]) -> tuple[list[str], dict[str, list[str]]]:
    """The tests, in order, of the worker that ran ``test``; and every worker's."""
    by_worker: dict[str, list[str]] = {}
    for r in runs:
        by_worker.setdefault(r["worker"], []).append(r["test"])
    return next(tests for tests in by_worker.values() if test in tests), by_worker


@pytest.mark.slow
def test_a_groups_tests_and_its_module_fixture_stay_in_one_worker(tmp_path):
    # three units for two workers would go to both: one group goes to one
    grouped = run_suite(tmp_path, ("test_grouped.py", GROUPED))
    assert len(grouped) == 3 and len({r["worker"] for r in grouped}) == 1, (
        f"a group's tests ran on several workers: {grouped}")
    assert {r["fixture_worker"] for r in grouped} == {grouped[0]["worker"]}


@pytest.mark.slow
def test_a_slow_test_goes_out_before_fast_ones_collected_ahead_of_it(tmp_path):
    worker, by_worker = worker_of("slow", run_suite(tmp_path, ("test_loose.py", LOOSE)))
    assert worker[0] == "slow", f"a fast test ran before the slow one on its worker: {by_worker}"


@pytest.mark.slow
def test_a_test_that_runs_alone_goes_out_first_even_collected_last(tmp_path):
    worker, by_worker = worker_of("alone", run_suite(tmp_path, ("test_loose.py", LAST_ALONE)))
    assert worker[0] == "alone", f"a test ran before the alone one on its worker: {by_worker}"


class Marked:
    """A collected test as runs_alone reads it: its marks, nearest first."""

    def __init__(self, *decorators: pytest.MarkDecorator):
        self.marks = [d.mark for d in decorators]

    def iter_markers(self, name: str):
        return (m for m in self.marks if m.name == name)

    def get_closest_marker(self, name: str):
        return next(self.iter_markers(name), None)


def test_an_alone_test_its_marks_skip_does_not_keep_the_other_worker_waiting():
    from xdist_order import runs_alone

    alone = pytest.mark.alone
    assert runs_alone(Marked(alone)) and not runs_alone(Marked(pytest.mark.slow))
    assert runs_alone(Marked(alone, pytest.mark.skipif(False, reason="runs")))
    assert not runs_alone(Marked(alone, pytest.mark.skipif(True, reason="set AUTOTUNE_TEST_FULL_MEMORY=1")))
    assert not runs_alone(Marked(alone, pytest.mark.skipif(False, True, reason="either holds")))
    assert not runs_alone(Marked(alone, pytest.mark.skipif(condition=True, reason="by keyword")))
    assert not runs_alone(Marked(alone, pytest.mark.skip(reason="never runs")))
    # a string condition is pytest's to evaluate, later: such a test still runs alone
    assert runs_alone(Marked(alone, pytest.mark.skipif("sys.platform != 'linux'", reason="not decided here")))
