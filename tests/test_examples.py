"""The bundled examples pass the contract check and train; the transformers one (dict
batches, a model computing its own loss) skips with the reason where transformers is not
installed."""
from __future__ import annotations

import subprocess
import sys

import pytest

from autotune import runtime
from autotune.task import load_task

from helpers import REPO

EXAMPLES = REPO / "examples"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fashion_cnn.py", "tiny_gpt.py", "augmented_images.py"])
def test_an_example_passes_the_contract_and_its_loss_falls(name):
    if name == "tiny_gpt.py":
        pytest.importorskip("transformers", reason="examples/tiny_gpt.py needs pip install 'autotune[examples]'")
    task = load_task(EXAMPLES / name)
    assert task.has_evaluate
    session = runtime.Session(str(EXAMPLES / name), {"batch_size": task.batch_size, "threads": 2})
    _, losses = session.run_steps(30)
    assert sum(losses[-5:]) < sum(losses[:5]), losses


def test_the_transformers_example_says_how_to_install_what_it_needs(tmp_path):
    # a transformers that cannot be imported, ahead of any installed one
    (tmp_path / "transformers").mkdir()
    (tmp_path / "transformers" / "__init__.py").write_text("raise ImportError('not here')\n")
    proc = subprocess.run([sys.executable, "-c", f"import runpy; runpy.run_path({str(EXAMPLES / 'tiny_gpt.py')!r})"],
                          capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0
    assert "needs the transformers package: pip install 'autotune[examples]'" in proc.stderr
