"""evaluate(model) gets the model on its training device (cuda:N in a GPU run), so every
evaluate() autotune ships (the examples, the `autotune init` template, the test models)
moves its inputs to the model's device. Without a GPU, the model is put on the "meta"
device and its forward pass records where its inputs are."""
from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest

from autotune.runtime.data import tensors
from autotune.runtime.session import load_user_module
from autotune.task import check as task_check
from autotune.task import load as task_load
from autotune.task import load_task
from autotune.task.check_result import CheckResult
from autotune.task.load import recognise

from helpers import MODELS, REPO

IDIOM = "next(model.parameters()).device"


def _files_with_evaluate() -> list[Path]:
    candidates = [*sorted((REPO / "examples").glob("*.py")), REPO / "autotune" / "templates" / "model_file.py",
                  *sorted(MODELS.rglob("*.py"))]
    # a script the user runs (a plain loop) may define an evaluate() of its own: no contract's
    return [p for p in candidates if _evaluate_source(p) is not None and recognise(p, p.read_text()) == "model_file"]


def _evaluate_source(path: Path) -> str | None:
    source = path.read_text()
    try:
        tree = ast.parse(source)
    except SyntaxError:  # tests/models/faulty/syntax_error.py, on purpose
        return None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "evaluate":
            return ast.get_source_segment(source, node)
    return None


FILES = _files_with_evaluate()
IDS = [str(p.relative_to(REPO)) for p in FILES]


def test_every_bundled_model_file_with_evaluate_is_found():
    assert {"examples/fashion_cnn.py", "examples/tiny_gpt.py", "examples/augmented_images.py",
            "autotune/templates/model_file.py", "tests/models/knob_cnn.py",
            "tests/models/tiny_cnn.py"} <= set(IDS)


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_evaluate_uses_the_models_device(path):
    assert IDIOM in _evaluate_source(path), f"{path.name}: evaluate() must move its inputs to {IDIOM}"


class _Reached(Exception):
    """The model's forward was called: evaluate need not go further."""


def _devices(obj) -> set[str]:
    return {t.device.type for t in tensors(obj)}


@pytest.mark.parametrize("path", FILES, ids=IDS)
def test_evaluate_calls_the_model_with_inputs_on_its_device(path):
    if path.name == "tiny_gpt.py" and importlib.util.find_spec("transformers") is None:
        pytest.skip("examples/tiny_gpt.py needs transformers")
    module = load_user_module(str(path))
    # On "meta" the model holds no data: a forward with inputs elsewhere is what a CUDA
    # model given CPU inputs would refuse.
    model = module.build_model().to("meta")
    seen: list[set[str]] = []

    def record(_module, args, kwargs):
        seen.append(_devices((args, kwargs)))
        raise _Reached

    model.register_forward_pre_hook(record, with_kwargs=True)
    with pytest.raises(_Reached):
        module.evaluate(model)
    assert seen == [{"meta"}], f"{path.name}: evaluate() called the model on inputs on {seen}"


def test_the_check_times_one_evaluate_call(monkeypatch):
    """Task.evaluate_s, the seconds of the check's one evaluate() call: what each evaluation of
    verification's scored trainings is priced at (verify.fit.gates_cost, Trainings.limit_s).
    tests/models/slow_evaluate.py's evaluate() sleeps AUTOTUNE_TEST_EVALUATE_S. The check runs
    here, in this process; its answer crosses to the Task as it does from the child."""
    path = str(MODELS / "slow_evaluate.py")
    monkeypatch.setenv("AUTOTUNE_TEST_EVALUATE_S", "0.5")
    slow = task_check._check(path, "cpu")
    monkeypatch.setenv("AUTOTUNE_TEST_EVALUATE_S", "0")
    quick = task_check._check(path, "cpu")
    assert slow.evaluate_s >= 0.5 and 0.0 < quick.evaluate_s < 0.25
    answer = json.loads(json.dumps(CheckResult(checked=slow).to_json()))
    monkeypatch.setattr(task_load, "_run_check", lambda *a, **kw: CheckResult.from_json(answer))
    assert load_task(path).evaluate_s == slow.evaluate_s
