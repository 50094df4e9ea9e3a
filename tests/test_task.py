"""The model-file contract: every violation is one clear ContractError that
names the file, the function and what was expected, raised before any trial starts."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from autotune.errors import ContractError
from autotune.task import load_task
from autotune.trials.proctree import with_package_on_path

from helpers import MODELS, REPO

AUTOTUNE_DIR = str(REPO / "autotune")

# A valid model file in parts; a test replaces or drops a part (None) to break one rule.
PARTS = {
    "header": "import torch\nfrom torch import nn\n",
    "batch_size": "batch_size = 8\n",
    "model": textwrap.dedent('''
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(12, 3)

            def forward(self, x):
                return self.fc(x)

        def build_model():
            return Net()
        '''),
    "dataset": textwrap.dedent('''
        def build_dataset():
            g = torch.Generator().manual_seed(0)
            return torch.utils.data.TensorDataset(
                torch.randn(16, 12, generator=g), torch.randint(0, 3, (16,), generator=g))
        '''),
    "extra": "",
}


def model_file(tmp_path: Path, name: str = "user_model.py", **parts: str | None) -> Path:
    merged = {**PARTS, **parts}
    path = tmp_path / name
    path.write_text("\n".join(text for text in merged.values() if text))
    return path


def contract_error(path: Path) -> str:
    with pytest.raises(ContractError) as info:
        load_task(path)
    return str(info.value)


# --- before importing the file --------------------------------------------------------


def test_missing_file(tmp_path):
    msg = contract_error(tmp_path / "no_such_model.py")
    assert "no_such_model.py" in msg and "no such file" in msg


def test_directory_instead_of_file(tmp_path):
    folder = tmp_path / "a_model_folder"
    folder.mkdir()
    msg = contract_error(folder)
    assert "a_model_folder" in msg and "not a file" in msg and ".py" in msg


def test_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "broken_syntax.py"
    path.write_text("import torch\n\ndef build_model(:\n    pass\n")
    msg = contract_error(path)
    assert "broken_syntax.py:3" in msg
    assert "syntax error" in msg


# --- importing the file -----------------------------------------------------------------


@pytest.mark.slow
def test_import_error_shows_the_users_traceback_not_the_tuners(tmp_path):
    path = model_file(tmp_path, "imports_missing.py",
                      header="import torch\nfrom torch import nn\nimport autotune_test_missing_mod\n")
    msg = contract_error(path)
    assert "imports_missing.py" in msg and "importing the file" in msg
    assert "ModuleNotFoundError" in msg and "autotune_test_missing_mod" in msg
    # The user's frame, with its line, is shown ...
    assert f'File "{path.resolve()}", line 3' in msg
    # ... and none of the tuner's own frames.
    assert AUTOTUNE_DIR not in msg
    assert "importlib" not in msg


@pytest.mark.slow
def test_sys_exit_at_import_is_reported_not_a_crash(tmp_path):
    path = model_file(tmp_path, "exits.py",
                      header="import sys\nimport torch\nfrom torch import nn\nsys.exit('no GPU here')\n")
    msg = contract_error(path)
    assert "exits.py" in msg and "importing the file" in msg
    assert "SystemExit: no GPU here" in msg
    assert "ended abruptly" not in msg


@pytest.mark.slow
def test_missing_build_model(tmp_path):
    msg = contract_error(model_file(tmp_path, "no_model.py", model=None))
    assert "no_model.py" in msg and "build_model" in msg and "def build_model()" in msg
    assert "build_dataset" not in msg


@pytest.mark.slow
def test_missing_build_dataset(tmp_path):
    msg = contract_error(model_file(tmp_path, "no_dataset.py", dataset=None))
    assert "no_dataset.py" in msg and "def build_dataset()" in msg


@pytest.mark.slow
def test_build_model_returns_a_non_module(tmp_path):
    path = model_file(tmp_path, "dict_model.py", extra="def build_model():\n    return {'w': 1}\n")
    msg = contract_error(path)
    assert "dict_model.py" in msg and "build_model()" in msg
    assert "returned dict" in msg and "torch.nn.Module" in msg


@pytest.mark.slow
def test_build_dataset_returns_a_list(tmp_path):
    path = model_file(tmp_path, "list_data.py", extra=textwrap.dedent('''
        def build_dataset():
            return [(torch.randn(12), torch.tensor(0)) for _ in range(16)]
        '''))
    msg = contract_error(path)
    assert "list_data.py" in msg and "build_dataset()" in msg
    assert "returned list" in msg and "map-style" in msg


@pytest.mark.slow
def test_build_dataset_returns_a_generator(tmp_path):
    # One epoch would use a generator up: the error names both kinds of dataset that work.
    path = model_file(tmp_path, "stream_data.py", extra=textwrap.dedent('''
        def build_dataset():
            return ((torch.randn(12), torch.tensor(0)) for _ in range(16))
        '''))
    msg = contract_error(path)
    assert "stream_data.py" in msg and "build_dataset() returned generator" in msg
    assert "map-style" in msg and "IterableDataset" in msg


@pytest.mark.parametrize("item, expected", [
    ("torch.randn(12)", "is a Tensor"),
    ("(torch.randn(12), torch.tensor(0), torch.tensor(1))", "of 3 elements"),
    ("(torch.randn(12), 'cat')", "expected tensors"),
], ids=["bare_tensor", "triple", "string_target"])
@pytest.mark.slow
def test_dataset_items_are_not_input_target_pairs(tmp_path, item, expected):
    path = model_file(tmp_path, "bad_items.py", extra=textwrap.dedent(f'''
        class Items(torch.utils.data.Dataset):
            def __len__(self):
                return 16

            def __getitem__(self, i):
                return {item}

        def build_dataset():
            return Items()
        '''))
    msg = contract_error(path)
    assert "bad_items.py" in msg and "build_dataset()[0]" in msg and expected in msg
    if expected != "expected tensors":
        assert "(inputs, targets) pair" in msg


@pytest.mark.parametrize("value", ["0", "'32'", "True"])
@pytest.mark.slow
def test_batch_size_must_be_a_positive_int(tmp_path, value):
    msg = contract_error(model_file(tmp_path, "bad_batch.py", batch_size=f"batch_size = {value}\n"))
    assert "bad_batch.py" in msg and f"batch_size = {value}" in msg
    assert "positive integer" in msg


@pytest.mark.slow
def test_dataset_smaller_than_one_batch(tmp_path):
    msg = contract_error(model_file(tmp_path, "small_data.py", batch_size="batch_size = 64\n"))
    assert "small_data.py" in msg and "16 items" in msg and "batch_size = 64" in msg


@pytest.mark.slow
def test_evaluate_returning_a_string(tmp_path):
    path = model_file(tmp_path, "eval_str.py", extra="def evaluate(model):\n    return '92%'\n")
    msg = contract_error(path)
    assert "eval_str.py" in msg and "evaluate(model)" in msg
    assert "returned str" in msg and "expected a number" in msg


@pytest.mark.slow
def test_forward_shape_mismatch_is_named_as_the_models_forward(tmp_path):
    # 10 features into a Linear(12, 3): fails in the first forward pass.
    path = model_file(tmp_path, "bad_shape.py", extra=textwrap.dedent('''
        def build_dataset():
            return torch.utils.data.TensorDataset(torch.randn(16, 10), torch.randint(0, 3, (16,)))
        '''))
    msg = contract_error(path)
    assert "bad_shape.py" in msg
    assert "forward" in msg and "raised an error" in msg
    assert "return self.fc(x)" in msg  # the user's own line
    assert "mat1 and mat2" in msg      # torch's own words on the shapes
    assert AUTOTUNE_DIR not in msg


# --- valid files -----------------------------------------------------------------------


@pytest.mark.slow
def test_valid_image_model_describes_the_task():
    task = load_task(MODELS / "tiny_cnn.py")
    assert task.path == (MODELS / "tiny_cnn.py").resolve()
    assert task.batch_size == 16
    assert task.dataset_len == 512
    assert task.image_inputs is True
    assert task.has_evaluate is True
    assert task.parameters == (3 * 8 * 9 + 8) + (8 * 16 * 4 + 4)


@pytest.mark.slow
def test_valid_flat_model_with_training_step_and_defaults(tmp_path):
    path = model_file(tmp_path, "flat.py", batch_size=None, extra=textwrap.dedent('''
        def build_dataset():
            return torch.utils.data.TensorDataset(torch.randn(40, 12), torch.randint(0, 3, (40,)))

        def training_step(model, batch):
            inputs, targets = batch
            return torch.nn.functional.cross_entropy(model(inputs), targets)
        '''))
    task = load_task(path)
    assert task.batch_size == 32  # the contract's default
    assert task.dataset_len == 40
    assert task.image_inputs is False
    assert task.has_evaluate is False
    assert task.evaluate_s == 0.0  # nothing to price in verification
    assert task.batchnorm_layers == ()


@pytest.mark.slow
def test_training_step_lifts_the_input_target_pair_rule(tmp_path):
    # Items as dicts: the default step could not unpack them, the file's training_step can.
    path = model_file(tmp_path, "dict_items.py", extra=textwrap.dedent('''
        class Items(torch.utils.data.Dataset):
            def __len__(self):
                return 16

            def __getitem__(self, i):
                return {"x": torch.randn(12), "y": torch.tensor(i % 3)}

        def build_dataset():
            return Items()

        def training_step(model, batch):
            return torch.nn.functional.cross_entropy(model(batch["x"]), batch["y"])
        '''))
    assert load_task(path).dataset_len == 16


@pytest.mark.slow
def test_a_failing_training_step_is_named(tmp_path):
    path = model_file(tmp_path, "bad_step.py", extra=textwrap.dedent('''
        def training_step(model, batch):
            raise ValueError("no loss here")
        '''))
    msg = contract_error(path)
    assert "bad_step.py" in msg and "training_step(model, batch) raised an error" in msg
    assert "ValueError: no loss here" in msg


@pytest.mark.slow
def test_batchnorm_layers_are_named(tmp_path):
    path = model_file(tmp_path, "bn.py", model=textwrap.dedent('''
        def build_model():
            return nn.Sequential(nn.Linear(12, 8), nn.BatchNorm1d(8), nn.ReLU(),
                                 nn.Sequential(nn.Linear(8, 3), nn.LazyBatchNorm1d()))
        '''))
    assert load_task(path).batchnorm_layers == ("1", "3.1")


# --- the check runs the user's code in a child process that leaves nothing behind --------


def test_with_package_on_path_puts_autotune_first_and_keeps_the_users_path():
    env = with_package_on_path({"PYTHONPATH": "/user/lib", "HOME": "/home/u"}, "/src/autotune-repo")
    assert env == {"PYTHONPATH": os.pathsep.join(["/src/autotune-repo", "/user/lib"]), "HOME": "/home/u"}
    assert with_package_on_path({}, "/src/autotune-repo") == {"PYTHONPATH": "/src/autotune-repo"}
    assert with_package_on_path({"PYTHONPATH": ""}, "/r") == {"PYTHONPATH": "/r"}


HELPER = textwrap.dedent('''
    import subprocess, sys

    def _start_helper():
        # A helper in a session of its own that inherits stdout/stderr (a data server,
        # a forgotten subprocess): it must neither outlive the check nor stall it.
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{token}"],
                         start_new_session=True)
    ''')


def _processes_with(token: str) -> list:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if token in (proc.info["cmdline"] or []) and proc.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(proc)
    return found


def _kill_all(token: str) -> None:
    for proc in _processes_with(token):
        proc.kill()


@pytest.mark.slow
def test_check_ends_processes_the_file_started(tmp_path):
    import time
    import uuid

    token = f"autotune-test-helper-{uuid.uuid4().hex}"
    path = model_file(tmp_path, "starts_helper.py", extra=HELPER.format(token=token) + textwrap.dedent('''
        _dataset = build_dataset

        def build_dataset():
            _start_helper()
            return _dataset()
        '''))
    try:
        # held up by the helper's open stdout, the check would run into its limit and raise
        task = load_task(path, timeout_s=60)
        assert task.dataset_len == 16
        time.sleep(0.5)
        assert _processes_with(token) == []
    finally:
        _kill_all(token)


@pytest.mark.slow
def test_check_that_hangs_is_stopped_with_everything_it_started(tmp_path):
    import time
    import uuid

    token = f"autotune-test-helper-{uuid.uuid4().hex}"
    path = model_file(tmp_path, "hangs.py", extra=HELPER.format(token=token) + textwrap.dedent('''
        def build_model():
            _start_helper()
            import time
            time.sleep(600)
        '''))
    try:
        msg = contract_error_with(path, timeout_s=8)
        assert "hangs.py" in msg and "took over 8 s" in msg and "build_model" in msg
        time.sleep(0.5)
        assert _processes_with(token) == []
    finally:
        _kill_all(token)


def contract_error_with(path: Path, **kwargs) -> str:
    with pytest.raises(ContractError) as info:
        load_task(path, **kwargs)
    return str(info.value)


# --- the command line -------------------------------------------------------------------


def _autotune_run(model: Path, out: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "autotune", "run", str(model.relative_to(REPO)), "--out", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )


@pytest.mark.slow
def test_cli_contract_violation_exits_2_with_one_paragraph_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    proc = _autotune_run(MODELS / "bad_no_build_model.py", out)
    err = proc.stderr.strip()
    assert proc.returncode == 2, proc.stderr
    assert err.startswith("autotune run: error: tests/models/bad_no_build_model.py")
    assert "build_model" in err
    assert "Traceback" not in err
    assert "\n\n" not in err  # one paragraph
    assert not out.exists()   # bad input loses nothing and writes nothing
    assert proc.stdout == ""


@pytest.mark.slow
def test_cli_import_error_shows_only_the_users_frames(tmp_path):
    out = tmp_path / "out"
    proc = _autotune_run(MODELS / "bad_import.py", out)
    err = proc.stderr
    assert proc.returncode == 2, err
    assert "autotune run: error: tests/models/bad_import.py" in err
    assert "autotune_test_no_such_module" in err
    assert "_read_settings()" in err  # the user's call chain ...
    assert err.count("Traceback (most recent call last)") == 1
    assert AUTOTUNE_DIR + "/" not in err  # ... and none of autotune's frames
    assert not out.exists()


# --- the check puts the model where the trials do ----------------------------------------


def test_the_check_uses_the_first_gpu_when_cuda_is_available(monkeypatch):
    import torch

    from autotune.task import check as task_check

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert task_check.check_device() == "cuda:0"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert task_check.check_device() == "cpu"


RECORDS_ITS_MODEL = textwrap.dedent('''
    SEEN = []

    def evaluate(model):
        SEEN.append(getattr(model, "placed_on", None))
        return 1.0
    ''')


def test_the_checks_step_and_evaluate_run_on_cuda_0_when_cuda_is_available(tmp_path, monkeypatch):
    # No GPU here: the availability check and the moves are stand-ins that record the
    # device asked for; on a GPU machine they are torch's own.
    import torch

    from autotune.runtime import model as runtime_model
    from autotune.task import check as task_check

    placed, moved = [], []

    def place(model, device):
        placed.append(device)
        model.placed_on = device
        return model

    def move(obj, device, **_):
        moved.append(device)
        return obj

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(task_check, "_place", place)
    monkeypatch.setattr(runtime_model, "move", move)
    path = model_file(tmp_path, "placed_check.py", extra=RECORDS_ITS_MODEL)
    described = task_check._check(str(path))
    assert described.has_evaluate is True
    assert placed == ["cuda:0"]                # the model, before the optimizer is built
    assert moved == [torch.device("cuda:0")]   # the step's batch
    assert sys.modules["user_model_placed_check"].SEEN == ["cuda:0"]  # evaluate's model


# A device the model can be put on without a GPU: a layer whose weight is on "meta"
# refuses a CPU input, as a CUDA one does.
EVALUATE_ON_CPU = textwrap.dedent('''
    def evaluate(model):
        x = torch.randn(4, 12)
        return float(model(x).shape[0])
    ''')
EVALUATE_ON_THE_MODELS_DEVICE = textwrap.dedent('''
    def evaluate(model):
        x = torch.randn(4, 12).to(next(model.parameters()).device)
        return float(model(x).shape[0])
    ''')


@pytest.mark.slow
def test_an_evaluate_that_builds_cpu_inputs_fails_the_check_on_another_device(tmp_path):
    msg = contract_error_with(model_file(tmp_path, "eval_on_cpu.py", extra=EVALUATE_ON_CPU), device="meta")
    assert "eval_on_cpu.py" in msg and "evaluate(model) raised an error" in msg
    assert "not on the expected device" in msg  # torch's own words
    assert "training device (meta here)" in msg
    assert "move your inputs to next(model.parameters()).device" in msg


@pytest.mark.slow
def test_an_evaluate_that_follows_the_model_passes_the_check_on_another_device(tmp_path):
    task = load_task(model_file(tmp_path, "eval_follows.py", extra=EVALUATE_ON_THE_MODELS_DEVICE),
                     device="meta")
    assert task.has_evaluate and task.parameters == 12 * 3 + 3
