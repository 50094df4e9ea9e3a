"""Commands import only what they run: `autotune --version`, `init` and `probe` never load
the search's machinery (Optuna), so they start fast and work where it is broken."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Runs the command in a fresh interpreter, then reports which heavy modules it loaded.
SCRIPT = """
import json, sys
from autotune import cli
try:
    code = cli.main(sys.argv[1:])
except SystemExit as exc:  # --version and --help exit from argparse
    code = exc.code
print(json.dumps({"code": code, "loaded": sorted(
    m for m in ("optuna", "autotune.pipeline", "autotune.search.tuner", "autotune.search.study") if m in sys.modules)}))
"""


def _loaded(*argv: str, cwd: Path) -> dict:
    # the checkout's autotune, wherever the test runs from
    path = os.environ.get("PYTHONPATH")
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{path}" if path else str(REPO)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, *argv], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("argv", [["--version"], ["init", "model.py"], ["run", "--help"], ["probe", "--json"]])
def test_light_commands_do_not_import_the_search(tmp_path, argv):
    result = _loaded(*argv, cwd=tmp_path)
    assert result["code"] == 0
    assert result["loaded"] == []
    if argv[0] == "init":
        assert (tmp_path / "model.py").is_file()

