"""A check's child process (``python -m MODULE ...``): importing the user's file runs their
code, so a file that crashes, hangs or exits cannot take the tuner with it. The child runs in
a session of its own with its output in a file, not a pipe (a process the user's code leaves
running would hold a pipe open and keep us waiting for its end instead of the check's); on a
time-out its whole tree is ended."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from autotune.errors import ContractError
from autotune.runtime.json_value import JsonObject
from autotune.trials import proctree


def run_check(module: str, args: Sequence[str], *, env: Mapping[str, str], timeout_s: float,
              late: str, abrupt: str) -> tuple[JsonObject, str]:
    """Run ``python -m module OUT *args`` (``args[0]`` is the user's file, OUT its answer's
    path); returns the JSON it wrote and its log. ContractError ``late`` past ``timeout_s``,
    ``abrupt`` (with the exit code and the log's last lines) where it wrote nothing."""
    with tempfile.TemporaryDirectory(prefix="autotune-check-") as tmp:
        out, log = Path(tmp) / "result.json", Path(tmp) / "log.txt"
        with open(log, "wb") as log_file:
            proc = subprocess.Popen([sys.executable, "-m", module, args[0], str(out), *args[1:]],
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
