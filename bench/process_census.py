"""Which Python processes a command starts, what each costs in CPU, and whether it imported
torch and torch._dynamo: run the test command (or any command) under it to see where a 2-core
machine's time goes.

    python bench/process_census.py -- .venv/bin/python -m pytest -n 2 --dist loadgroup

Every Python interpreter the command starts (tests, autotune's trials, contract checks,
emitted scripts, ranks) imports a ``sitecustomize`` put first on PYTHONPATH, which writes
one line per process at its start, every second, and at its end (``atexit``, ``os._exit``): its
CPU time (user and system, its own, not its children's), its command line and the test that
started it (pytest's PYTEST_CURRENT_TEST, which child processes inherit). A process killed
by a signal keeps the line a thread of the hook rewrites every second: its CPU until then
(``ended`` counts the processes that wrote a last line). A process a warm interpreter
(``autotune/trials/warm_interpreter.py``) forked is counted as one of its own (``forked``: it did
not import torch itself, the interpreter it came from did); DataLoader workers forked from a
process are not new interpreters and are not counted apart.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HOOK = '''
import atexit, json, os, sys, threading, time

_dir = os.environ.get("CENSUS_DIR")
if _dir:
    # the pid and the start time: a 2-core run of 20 minutes goes through pid_max (32768) and
    # a process given an earlier one's pid would overwrite its row
    _path = os.path.join(_dir, f"{os.getpid()}-{time.time_ns()}.json")

    _pid = os.getpid()
    _forked_from_server = False

    def _write(done):
        if os.getpid() != _pid:  # a forked child (a DataLoader worker) ending: not counted apart
            return
        t = os.times()
        # orig_argv: at start sys.argv of ``python -m x`` is only ["-m"], and a process killed
        # by a signal keeps that row
        row = {"argv": list(getattr(sys, "orig_argv", sys.argv))[1:5],
               "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
               "xdist": os.environ.get("PYTEST_XDIST_WORKER", ""),
               "torch": "torch" in sys.modules, "dynamo": "torch._dynamo" in sys.modules,
               "forked": _forked_from_server, "cpu": t.user + t.system, "done": done}
        # whole rows only: the thread and the last write may both be writing
        part = f"{_path}.{threading.get_ident()}.part"
        try:
            with open(part, "w") as f:
                json.dump(row, f)
            os.replace(part, _path)
        except OSError:
            pass

    def _every_second():
        # a process killed by a signal (a warm trial process at the run's end) writes no last
        # line: its row is at most a second behind
        while True:
            time.sleep(1.0)
            _write(False)

    def _after_fork():
        # forked by a warm interpreter: a trial or a check, a row of its own (its CPU times
        # start at 0 with the fork); any other fork (a DataLoader worker) is not counted
        global _pid, _path, _forked_from_server
        if "autotune.trials.warm_interpreter" in " ".join(getattr(sys, "orig_argv", sys.argv)):
            _pid, _forked_from_server = os.getpid(), True
            _path = os.path.join(_dir, f"{_pid}-{time.time_ns()}.json")
            threading.Thread(target=_every_second, daemon=True, name="census").start()

    os.register_at_fork(after_in_child=_after_fork)
    _write(False)
    threading.Thread(target=_every_second, daemon=True, name="census").start()
    atexit.register(_write, True)
    _exit = os._exit

    def _exit_counted(code):
        _write(True)
        _exit(code)

    os._exit = _exit_counted
'''


KINDS = {"autotune.trials.worker": "trial process (worker.py)", "autotune.task.check": "contract check (check.py)",
         "autotune.trials.warm_interpreter": "warm interpreter (warm_interpreter.py)",
         "train_tuned.py": "emitted script (train_tuned.py)"}


def kind(row: dict) -> str:
    argv = [a for a in row["argv"] if not a.startswith("-") or a in ("-c", "-m")]  # -u, -X ...
    if not argv:
        return "?"
    if argv[0] == "-m" and len(argv) > 1:
        return KINDS.get(argv[1], f"-m {argv[1]}")
    name = Path(argv[0]).name
    if name in KINDS:
        return KINDS[name]
    if argv[0] == "-c":
        # an xdist worker runs no test when it starts; what it starts inherits the test's name
        return "the tests themselves (xdist workers)" if row["xdist"] and not row["test"] else (
            "spawned ranks and other python -c")
    return name


def module(row: dict) -> str:
    test = row["test"].split(" ")[0]
    return test.split("::")[0] if test else "(no test)"


def table(rows: list[dict], key, top: int) -> list[str]:
    groups: dict[str, list[dict]] = collections.defaultdict(list)
    for row in rows:
        groups[key(row)].append(row)
    ranked = sorted(groups.items(), key=lambda kv: -sum(r["cpu"] for r in kv[1]))
    lines = ["| | processes | forked warm | ended | importing torch | importing torch._dynamo | CPU s |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, group in ranked[:top]:
        cold = [r for r in group if not r.get("forked")]
        lines.append(f"| {name} | {len(group)} | {len(group) - len(cold)} | {sum(r['done'] for r in group)} | "
                     f"{sum(r['torch'] for r in cold)} | {sum(r['dynamo'] for r in cold)} | "
                     f"{sum(r['cpu'] for r in group):.0f} |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=15, help="rows of each table")
    parser.add_argument("--rows", type=Path, help="also write every process's row to this JSON file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to count after --")
    with tempfile.TemporaryDirectory() as hook_dir, tempfile.TemporaryDirectory() as census:
        Path(hook_dir, "sitecustomize.py").write_text(HOOK)
        path = os.pathsep.join(filter(None, [hook_dir, os.environ.get("PYTHONPATH")]))
        code = subprocess.call(command, env={**os.environ, "PYTHONPATH": path, "CENSUS_DIR": census})
        rows = []
        for file in Path(census).glob("*.json"):
            try:
                rows.append(json.loads(file.read_text()))
            except ValueError:  # not JSON: a file the hook did not write
                continue
    if args.rows:
        args.rows.write_text(json.dumps(rows))
    print(f"\n{len(rows)} Python processes, {sum(r['done'] for r in rows)} counted to their end, "
          f"{sum(r['cpu'] for r in rows):.0f} CPU s; the command exited {code}\n")
    print("\n".join(table(rows, kind, args.top)) + "\n")
    print("\n".join(table(rows, module, args.top)))
    return code


if __name__ == "__main__":
    sys.exit(main())
