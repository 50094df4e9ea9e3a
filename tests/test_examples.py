"""The bundled examples pass the contract check and train; the transformers one (dict
batches, a model computing its own loss) skips with the reason where transformers is not
installed (tests/test_api.py tunes it end to end). A library-style model file (dict items,
keyword arguments, an output with a .loss, training_step as a lambda) gets the knobs that
apply to it."""
from __future__ import annotations

import subprocess
import sys

import pytest

from autotune.runtime.facts import step_facts
from autotune.runtime.session import Session
from autotune.task import load_task

from helpers import MODELS, REPO

EXAMPLES = REPO / "examples"
# long_sequences.py's step (attention over 512 tokens) takes over a second on one thread; its
# loss falls from the first steps on
STEPS = {"long_sequences.py": 10}


@pytest.fixture
def torch_threads():
    """The Session sets this process's torch threads: put back what later tests find."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fashion_cnn.py", "tiny_gpt.py", "augmented_images.py", "long_sequences.py"])
def test_an_example_passes_the_contract_and_its_loss_falls(name, torch_threads):
    if name == "tiny_gpt.py":
        pytest.importorskip("transformers", reason="examples/tiny_gpt.py needs pip install 'autotune[examples]'")
    task = load_task(EXAMPLES / name)
    assert task.has_evaluate
    if name == "long_sequences.py":  # the memory knobs' example: its repeated blocks are found
        assert task.blocks == ("Block",)
    # one thread: this test's steps share the cores with the other test worker's (pytest -n 2)
    session = Session(str(EXAMPLES / name), {"batch_size": task.batch_size, "threads": 1})
    _, losses = session.run_steps(STEPS.get(name, 30))
    assert sum(losses[-5:]) < sum(losses[:5]), losses


def test_the_transformers_example_says_how_to_install_what_it_needs(tmp_path):
    # a transformers that cannot be imported, ahead of any installed one
    (tmp_path / "transformers").mkdir()
    (tmp_path / "transformers" / "__init__.py").write_text("raise ImportError('not here')\n")
    proc = subprocess.run([sys.executable, "-c", f"import runpy; runpy.run_path({str(EXAMPLES / 'tiny_gpt.py')!r})"],
                          capture_output=True, text=True, env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0
    assert "needs the transformers package: pip install 'autotune[examples]'" in proc.stderr


@pytest.mark.slow
def test_dict_batches_find_their_image_and_train_channels_last(torch_threads):
    path = MODELS / "dict_batches.py"
    task = load_task(path)
    assert task.image_inputs, "the image counts though it is not the item's first entry"
    assert task.has_training_step, "the tuner must know it cannot call the model itself"
    session = Session(str(path), {"batch_size": 8, "threads": 1, "channels_last": True})
    _, facts = step_facts(session)
    assert facts["conv_inputs_channels_last"] == [True]
    assert facts["per_rank_batch"] == 8
    _, losses = session.run_steps(30)
    assert sum(losses[-5:]) < sum(losses[:5]), losses
