"""The user's model file: loading it and checking the contract.

The file is checked before any trial starts. Importing it runs the user's code, so
that happens in a child process (``python -m autotune.task FILE OUT``): a file that
crashes, hangs or exits cannot take the tuner with it. Every violation becomes one
ContractError naming the file, the function and the fix.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

from autotune import proctree
from autotune.errors import ContractError

REQUIRED = ("build_model", "build_dataset")
OPTIONAL_FUNCTIONS = (
    "loss_fn", "build_optimizer", "training_step", "collate_fn", "evaluate",
)
CHECK_TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class Task:
    """What the tuner knows about a valid model file."""

    path: Path
    batch_size: int
    dataset_len: int
    image_inputs: bool  # 4-D float inputs: channels_last can apply
    has_evaluate: bool
    has_training_step: bool
    parameters: int
    # Names of BatchNorm layers: several ranks would each normalize over their own share
    # of the batch, so a multi-rank layout trains a different model (see space.py).
    batchnorm_layers: tuple[str, ...] = ()
    check_s: float = 0.0  # how long the check took: import, build_dataset, build_model, a step

    @property
    def name(self) -> str:
        return self.path.stem


def load_task(path: str | os.PathLike[str], *, timeout_s: float = CHECK_TIMEOUT_S) -> Task:
    """Check the model file and describe it, or raise ContractError."""
    path = Path(path)
    if not path.exists():
        raise ContractError(f"{path}: no such file. Give the path of your model file (a .py file).")
    if not path.is_file():
        raise ContractError(f"{path}: not a file. Give the path of your model file (a .py file).")
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ContractError(f"{path}: cannot be read ({exc}).") from None
    try:
        compile(source, str(path), "exec")
    except SyntaxError as exc:
        raise ContractError(
            f"{path}:{exc.lineno}: syntax error: {exc.msg}. Fix the file so that "
            f"`python {path}` runs."
        ) from None

    with tempfile.TemporaryDirectory(prefix="autotune-check-") as tmp:
        out = Path(tmp) / "result.json"
        package_root = str(Path(__file__).resolve().parent.parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
        log = Path(tmp) / "log.txt"
        timed_out = False
        # Output goes to a file, not a pipe: a process the user's code leaves running would
        # hold a pipe open and keep us waiting for its end instead of the check's.
        started = time.monotonic()
        with open(log, "wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "autotune.task", str(path.resolve()), str(out)],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env,
                start_new_session=True,
            )
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                # Still running, so its whole tree can be found: end all of it. (When the
                # check ends by itself, it ends what it started: see _main.)
                proctree.kill_tree(proc.pid)
                proc.wait()
        if timed_out:
            raise ContractError(
                f"{path}: checking the file took over {timeout_s:.0f} s (importing it, building "
                "the model and dataset, one training step). Make build_model/build_dataset quick."
            )
        if not out.exists():
            text = log.read_text(errors="replace")
            tail = "\n".join(text.strip().splitlines()[-5:])
            raise ContractError(
                f"{path}: the process checking the file ended abruptly (exit code "
                f"{proc.returncode}) while importing or calling it.\n{tail}"
            )
        result = json.loads(out.read_text())
    if result.get("error"):
        raise ContractError(result["error"])
    described = result["task"]
    described["batchnorm_layers"] = tuple(described.get("batchnorm_layers", ()))
    return Task(path=path.resolve(), check_s=time.monotonic() - started, **described)


# --- what runs in the child process -------------------------------------------------


def _user_frames(tb: str, path: str) -> str:
    """The user's own part of a traceback: from their file's first frame on."""
    lines = tb.strip().splitlines()
    for i, line in enumerate(lines):
        if path in line:
            return "\n".join(["Traceback (most recent call last):", *lines[i:]][-12:])
    return "\n".join(lines[-6:])


def _is_nested_tensors(obj: Any) -> bool:
    import torch

    if isinstance(obj, (torch.Tensor, int, float, bool)):
        return True
    if isinstance(obj, dict):
        return all(_is_nested_tensors(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(_is_nested_tensors(v) for v in obj)
    return False


class _NoUpdate:
    """The check's optimizer when the file brings none: clears gradients, changes no weight.

    Not a torch.optim optimizer on purpose: constructing one imports torch._dynamo, which
    takes seconds, and the check only needs the forward and backward pass to run."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.model.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        pass


def _check(path: str) -> dict[str, Any]:
    """The contract, checked in order; returns the Task fields or raises ContractError."""
    import torch

    from autotune import runtime

    shown = os.path.relpath(path)

    def call(fn_name: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except (Exception, SystemExit):  # noqa: BLE001  (the user's error, shown as theirs)
            raise ContractError(
                f"{shown}: {fn_name} raised an error:\n{_user_frames(traceback.format_exc(), path)}"
            ) from None

    try:
        module = runtime.load_user_module(path)
    except (Exception, SystemExit):  # noqa: BLE001  (sys.exit() at import, too)
        raise ContractError(
            f"{shown}: importing the file raised an error:\n"
            f"{_user_frames(traceback.format_exc(), path)}"
        ) from None

    for name in REQUIRED:
        fn = getattr(module, name, None)
        if fn is None:
            raise ContractError(
                f"{shown}: no function {name}(). The model file must define "
                f"`def {name}()`; see the README's model-file contract."
            )
        if not callable(fn):
            raise ContractError(f"{shown}: {name} is a {type(fn).__name__}, not a function.")
    for name in OPTIONAL_FUNCTIONS:
        value = getattr(module, name, None)
        if value is not None and not callable(value):
            raise ContractError(f"{shown}: {name} is a {type(value).__name__}, not a function.")

    batch_size = getattr(module, "batch_size", 32)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ContractError(
            f"{shown}: batch_size = {batch_size!r}; expected a positive integer "
            "(the batch size you train with today), e.g. `batch_size = 32`."
        )

    model = call("build_model()", module.build_model)
    if not isinstance(model, torch.nn.Module):
        raise ContractError(
            f"{shown}: build_model() returned {type(model).__name__}; expected a "
            "torch.nn.Module. Return the model instance, e.g. `return MyNet()`."
        )
    dataset = call("build_dataset()", module.build_dataset)
    # A plain list/tuple/dict is not a Dataset (the contract asks for one; a dict "works"
    # only by accident of its keys), and an IterableDataset cannot be sharded by index.
    kind = type(dataset).__name__
    if isinstance(dataset, torch.utils.data.IterableDataset):
        kind += " (an IterableDataset)"
    if isinstance(dataset, (list, tuple, dict, torch.utils.data.IterableDataset)) or not (
        hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
    ):
        raise ContractError(
            f"{shown}: build_dataset() returned {kind}; expected a map-style "
            "torch.utils.data.Dataset (with __len__ and __getitem__), e.g. a TensorDataset."
        )
    n = call("len(build_dataset())", len, dataset)
    if n < 2:
        raise ContractError(f"{shown}: build_dataset() returned a dataset of {n} items; need at least 2.")
    if n < batch_size:
        # Every epoch drops its ragged last batch: no batch of batch_size would ever run.
        raise ContractError(
            f"{shown}: build_dataset() returned {n} items, fewer than batch_size = {batch_size}; "
            "expected at least one full batch. Lower batch_size or return more items."
        )
    item = call("build_dataset()[0]", dataset.__getitem__, 0)
    has_training_step = getattr(module, "training_step", None) is not None
    if not has_training_step:
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise ContractError(
                f"{shown}: build_dataset()[0] is a {type(item).__name__}"
                + (f" of {len(item)} elements" if isinstance(item, (tuple, list)) else "")
                + "; expected an (inputs, targets) pair. Return `(inputs, targets)` from "
                "__getitem__, or define training_step(model, batch) for another layout."
            )
        if not _is_nested_tensors(item[0]) or not _is_nested_tensors(item[1]):
            raise ContractError(
                f"{shown}: build_dataset()[0] holds {type(item[0]).__name__} inputs and "
                f"{type(item[1]).__name__} targets; expected tensors (or tuples/lists/dicts of them)."
            )

    # One real training step on two items: a shape or dtype mistake shows here, named,
    # instead of failing every trial.
    collate = getattr(module, "collate_fn", None) or torch.utils.data.default_collate
    batch = call("collate_fn" if getattr(module, "collate_fn", None) else "collating two items",
                 collate, [dataset[0], dataset[1]])
    cfg = {"precision": "fp32"}

    class _Dist:
        device = torch.device("cpu")

    optimizer_fn = getattr(module, "build_optimizer", None)
    optimizer = (call("build_optimizer(params)", optimizer_fn, model.parameters())
                 if optimizer_fn else _NoUpdate(model))
    if not isinstance(optimizer, (torch.optim.Optimizer, _NoUpdate)):
        raise ContractError(
            f"{shown}: build_optimizer(params) returned {type(optimizer).__name__}; expected a "
            "torch.optim.Optimizer built on the given params."
        )
    step = runtime.make_step(module, model, optimizer, cfg, _Dist())
    what = "training_step(model, batch)" if has_training_step else "the model's forward and loss_fn"
    loss = call(what, step, batch)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ContractError(
            f"{shown}: {what} gave {type(loss).__name__}"
            + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else "")
            + "; expected a scalar loss tensor."
        )
    if getattr(module, "evaluate", None) is not None:
        score = call("evaluate(model)", module.evaluate, model)
        if isinstance(score, torch.Tensor) and score.numel() == 1:
            score = score.item()
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise ContractError(
                f"{shown}: evaluate(model) returned {type(score).__name__}; expected a number "
                "(higher is better)."
            )

    inputs = item[0] if isinstance(item, (tuple, list)) and item else item
    first = runtime._first_tensor(inputs)
    return {
        "batch_size": batch_size,
        "dataset_len": n,
        "image_inputs": bool(first is not None and first.dim() == 3 and first.is_floating_point()),
        "has_evaluate": getattr(module, "evaluate", None) is not None,
        "has_training_step": has_training_step,
        "parameters": sum(p.numel() for p in model.parameters()),
        "batchnorm_layers": [name for name, m in model.named_modules()
                             if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)],
    }


def _end_descendants() -> None:
    """End every process the user's code started here (a data server, a helper in a
    session of its own): the check must leave nothing running behind it."""
    import psutil

    for child in psutil.Process().children():
        proctree.kill_tree(child.pid)


def _main(argv: list[str]) -> int:
    path, out = argv
    # Orphans of the user's processes re-parent to us, so _end_descendants finds them;
    # and a tuner killed during the check takes the check with it.
    proctree.become_subreaper()
    proctree.die_with_parent()
    try:
        try:
            result = {"task": _check(path)}
        except ContractError as exc:
            result = {"error": str(exc)}
        Path(out).write_text(json.dumps(result))
    finally:
        _end_descendants()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
