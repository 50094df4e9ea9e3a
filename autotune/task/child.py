"""A check's child process (``python -m MODULE ...``): importing the user's file runs their
code, so a file that crashes, hangs or exits cannot take the tuner with it. The child runs in
a session of its own with its output in a file, not a pipe (a process the user's code leaves
running would hold a pipe open and keep us waiting for its end instead of the check's); on a
time-out its whole tree is ended."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from autotune.errors import ContractError
from autotune.runtime.json_value import JsonObject
from autotune.trials import proctree


def run_check(module: str, args: Sequence[str], *, env: Mapping[str, str], timeout_s: float,
              late: str, abrupt: str, framework: str | None = None) -> tuple[JsonObject, str]:
    """Run ``python -m module OUT *args`` (``args[0]`` is the user's file, OUT its answer's
    path), forked from a warm interpreter that imported torch and ``framework``
    (``forkserver.shared``) where one starts, else fresh; returns the JSON it wrote and its
    log. ContractError ``late`` past ``timeout_s``, ``abrupt`` (with the exit code and the
    log's last lines) where it wrote nothing."""
    from autotune.trials import forkserver

    # unbuffered as a trial's: its log whole where it hangs, and its warm interpreter one its
    # trials can fork from (``ForkServers.adopt``): a server's streams are set up at its start
    env = {**env, "PYTHONUNBUFFERED": "1"}
    with tempfile.TemporaryDirectory(prefix="autotune-check-") as tmp:
        out, log = Path(tmp) / "result.json", Path(tmp) / "log.txt"
        with open(log, "wb") as log_file:
            argv = [args[0], str(out), *args[1:]]
            proc: subprocess.Popen | forkserver.ForkedProcess
            try:
                proc = forkserver.shared().spawn(module, argv, env=env, cwd=Path.cwd(), log=log,
                                                 framework=framework)
            except forkserver.ForkServerError:
                proc = subprocess.Popen([sys.executable, "-m", module, *argv],
                                        stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                        env=dict(env), start_new_session=True)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                # Still running, so its whole tree can be found: end all of it. (When the
                # check ends by itself, it ends what it started.)
                proctree.kill_tree(proc.pid)
                proc.wait()
                raise ContractError(late) from None
        text = log.read_text(errors="replace")
        if not out.exists():
            tail = "\n".join(text.strip().splitlines()[-6:])
            raise ContractError(f"{abrupt} (exit code {proc.returncode}).\n{tail}")
        return json.loads(out.read_text()), text


# --- a script's check (a Trainer script, a Lightning script): its child's side and the tuner's

def script_child_main(check: Callable[[str, list[str], str], tuple[Any, float]], argv: list[str]) -> None:
    """The child's whole life: ``check(path, argv, out_dir)`` (facts with ``to_json``, and a
    step's seconds) run on the script, its answer (``{"script": ..., "step_s": ...}``, or
    ``{"error": ...}`` for a ContractError) written to OUT, everything the script started
    ended, then out at once: the script's thread waits inside its Trainer, nothing to tear down."""
    path, out, *script_argv = argv
    proctree.become_subreaper()
    proctree.die_with_parent()
    result: JsonObject
    # The script's output folder is in the tuner's temporary folder, beside OUT: the tuner
    # removes it once this process is over, also where it ended this one for being late
    # (a folder of this process's own would outlive it then)
    script_out = Path(out).parent / "script-output"
    script_out.mkdir()
    try:
        try:
            facts, step_s = check(path, script_argv, str(script_out))
            result = {"script": facts.to_json(), "step_s": step_s}
        except ContractError as exc:
            result = {"error": str(exc)}
        Path(out).write_text(json.dumps(result))
    finally:
        from autotune.task.check import _end_descendants

        _end_descendants()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def check_script_in_child(module: str, path: Path, argv: Sequence[str], *, timeout_s: float, calls: str,
                          framework: str, explain: Callable[[str, str], str] = lambda message, log: message,
                          steps: str = "its Trainer's first steps") -> tuple[JsonObject, float]:
    """Run ``python -m module SCRIPT OUT ARGS`` (``script_child_main``) on the script ``path``;
    the facts it wrote (JSON) and how long it took, or ContractError (its message through
    ``explain(message, log)``). ``calls``: what the script calls to train, for the message
    when it is late, and ``steps``: what it did not reach; ``framework``: the module it trains with (the
    warm interpreter imports it)."""
    from autotune.runtime.script_env import offline_env

    started = time.monotonic()
    data, log = run_check(
        module, [str(path.resolve()), *argv], env=offline_env(proctree.with_package_on_path(os.environ)),
        timeout_s=timeout_s, framework=framework,
        late=(f"{path}: the script did not reach {steps} within {timeout_s:.0f} s "
              "(importing it, building the model and data, two training steps). Make sure running it "
              f"reaches {calls} quickly."),
        abrupt=f"{path}: the process checking the script ended abruptly")
    if "error" in data:
        raise ContractError(explain(str(data["error"]), log))
    script = data["script"]
    assert isinstance(script, dict)
    return script, time.monotonic() - started


def explain_parser(message: str, log: str) -> str:
    """A check's message where the script's argument parser refused its arguments: argparse
    printed why (its "error:" line, in the check's log) and exited, so the message's "see its
    message above" becomes that line."""
    if "see its message above" in message:
        said = [line for line in log.splitlines() if "error:" in line]
        message = message.replace("see its message above", said[-1].strip() if said else "see --help")
    return message
