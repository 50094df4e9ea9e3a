"""The model file's contract, checked in a child process (``python -m autotune.task.check
FILE OUT [DEVICE]``, started by ``task.load_task``): it imports the user's file, builds the
model and dataset, runs one training step and evaluate(), and writes the Task fields, or
the ContractError that names what is wrong, to OUT.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from autotune.errors import ContractError
from autotune.runtime.knobs import DEFAULT_OPTIMIZER, Device, Precision
from autotune.task.check_result import CheckedFile, CheckResult
from autotune.task.dataset import check_dataset, check_dataset_len, check_item_is_pair, check_stream, is_stream
from autotune.trials import proctree
from autotune.user_file import UserFile, import_user_file

REQUIRED = ("build_model", "build_dataset")
OPTIONAL_FUNCTIONS = (
    "loss_fn", "build_optimizer", "training_step", "collate_fn", "evaluate",
)


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


def check_device() -> str:
    """Where the trials put the model, so where the check does: the first GPU when this
    process sees one (a trial's single rank, and rank 0 of several, use cuda:0)."""
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def _place(model: Any, device: str) -> Any:
    """The model on ``device``, as a trial moves it before building the optimizer."""
    return model.to(device)


def _check(path: str, device: str | None = None) -> CheckedFile:
    """The contract, checked in order, with the model on ``device`` (None: check_device());
    returns the Task fields or raises ContractError."""
    file = UserFile(path=path, shown=os.path.relpath(path))
    device = device or check_device()
    module = import_user_file(file)
    _check_functions(file, module)
    batch_size = _check_batch_size(file, module)
    model = _place(_check_model(file, module), device)
    dataset = check_dataset(file, module)
    if is_stream(dataset):
        items, n = check_stream(file, dataset, batch_size)
    else:
        n = check_dataset_len(file, file.call("len(build_dataset())", len, dataset), batch_size)
        items = [file.call(f"build_dataset()[{i}]", dataset.__getitem__, i) for i in (0, 1)]
    has_training_step = getattr(module, "training_step", None) is not None
    if not has_training_step:
        check_item_is_pair(file, items[0])
    optimizer = _check_training_step(file, module, model, items, has_training_step, device)
    evaluate_s = _check_evaluate(file, module, model, device) if getattr(module, "evaluate", None) is not None else 0.0
    return _describe(module, model, items[0], batch_size=batch_size, dataset_len=n, optimizer=optimizer,
                     evaluate_s=evaluate_s)


def _check_functions(file: UserFile, module: Any) -> None:
    """The required functions exist, and every contract name defined is callable."""
    for name in REQUIRED:
        fn = getattr(module, name, None)
        if fn is None:
            raise ContractError(
                f"{file.shown}: no function {name}(). The model file must define "
                f"`def {name}()`; see the README's model-file contract."
            )
        if not callable(fn):
            raise ContractError(f"{file.shown}: {name} is a {type(fn).__name__}, not a function.")
    for name in OPTIONAL_FUNCTIONS:
        value = getattr(module, name, None)
        if value is not None and not callable(value):
            raise ContractError(f"{file.shown}: {name} is a {type(value).__name__}, not a function.")


def _check_batch_size(file: UserFile, module: Any) -> int:
    """The file's batch_size (32 if it sets none), which must be a positive int."""
    batch_size = getattr(module, "batch_size", 32)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ContractError(
            f"{file.shown}: batch_size = {batch_size!r}; expected a positive integer "
            "(the batch size you train with today), e.g. `batch_size = 32`."
        )
    return batch_size


def _check_model(file: UserFile, module: Any) -> Any:
    """build_model() runs and returns a torch.nn.Module."""
    import torch

    model = file.call("build_model()", module.build_model)
    if not isinstance(model, torch.nn.Module):
        raise ContractError(
            f"{file.shown}: build_model() returned {type(model).__name__}; expected a "
            "torch.nn.Module. Return the model instance, e.g. `return MyNet()`."
        )
    return model


def _check_optimizer(file: UserFile, module: Any, model: Any) -> Any:
    """The file's build_optimizer(params), which must return a torch.optim.Optimizer;
    without one, an optimizer that changes nothing (the check needs no real update)."""
    import torch

    optimizer_fn = getattr(module, "build_optimizer", None)
    optimizer = (file.call("build_optimizer(params)", optimizer_fn, model.parameters())
                 if optimizer_fn else _NoUpdate(model))
    if not isinstance(optimizer, (torch.optim.Optimizer, _NoUpdate)):
        raise ContractError(
            f"{file.shown}: build_optimizer(params) returned {type(optimizer).__name__}; expected a "
            "torch.optim.Optimizer built on the given params."
        )
    return optimizer


def _check_training_step(file: UserFile, module: Any, model: Any, items: list[Any],
                         has_training_step: bool, device: str = "cpu") -> str:
    """One real training step on the first two items, on ``device`` in fp32: a shape or dtype
    mistake shows here, named, instead of failing every trial. The loss must be a scalar tensor.
    Returns the optimizer's class (Task.optimizer)."""
    import torch

    from autotune.runtime.model import make_step

    collate_fn = getattr(module, "collate_fn", None)
    batch = file.call("collate_fn" if collate_fn else "collating two items",
                      collate_fn or torch.utils.data.default_collate, items)
    optimizer = _check_optimizer(file, module, model)
    step = make_step(module, model, optimizer, {"precision": Precision.FP32}, torch.device(device))
    what = "training_step(model, batch)" if has_training_step else "the model's forward and loss_fn"
    loss = file.call(what, step, batch)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
        raise ContractError(
            f"{file.shown}: {what} gave {type(loss).__name__}"
            + (f" of shape {tuple(loss.shape)}" if isinstance(loss, torch.Tensor) else "")
            + "; expected a scalar loss tensor."
        )
    cls = type(optimizer)
    return DEFAULT_OPTIMIZER if isinstance(optimizer, _NoUpdate) else f"{cls.__module__}.{cls.__qualname__}"


def _check_evaluate(file: UserFile, module: Any, model: Any, device: str = "cpu") -> float:
    """evaluate(model) runs, with the model on ``device``, and returns a number (a 1-element
    tensor counts as one). Returns the seconds the call took (Task.evaluate_s): what each of
    the scored trainings' evaluations costs."""
    import torch

    try:
        started = time.perf_counter()
        score = file.call("evaluate(model)", module.evaluate, model)
        seconds = time.perf_counter() - started
    except ContractError as exc:
        if device == Device.CPU or not _names_a_device(str(exc)):
            raise
        raise ContractError(
            f"{exc}\nevaluate(model) gets the model on its training device ({device} here), as in "
            "the trials and train_tuned.py: move your inputs to next(model.parameters()).device, "
            "e.g. `x = x.to(next(model.parameters()).device)`."
        ) from None
    if isinstance(score, torch.Tensor) and score.numel() == 1:
        score = score.item()
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        raise ContractError(
            f"{file.shown}: evaluate(model) returned {type(score).__name__}; expected a number "
            "(higher is better)."
        )
    return seconds


def _names_a_device(message: str) -> bool:
    """Whether torch's error is about tensors on different devices ("Expected all tensors
    to be on the same device", "Input type (torch.FloatTensor) and weight type
    (torch.cuda.FloatTensor)", "Tensor on device meta is not on the expected device cpu")."""
    if "out of memory" in message:  # CUDA's own message names the device too
        return False
    return "device" in message or "weight type" in message


def _describe(module: Any, model: Any, item: Any, *, batch_size: int,
              dataset_len: int | None, optimizer: str, evaluate_s: float = 0.0) -> CheckedFile:
    """The Task fields of a file that passed every check (all but path and check_s)."""
    import torch

    from autotune.runtime.data import tensors
    from autotune.runtime.memory_knobs import block_names

    # An (inputs, targets) pair's inputs; any other item (a dict for training_step) whole:
    # its image need not come first, e.g. {"labels": ..., "pixel_values": ...}.
    inputs = item[0] if isinstance(item, (tuple, list)) and len(item) == 2 else item
    return CheckedFile(
        batch_size=batch_size,
        dataset_len=dataset_len,
        # One item's 3-D float input is a 4-D batch: an image layout channels_last applies to.
        image_inputs=any(t.dim() == 3 and t.is_floating_point() for t in tensors(inputs)),
        has_evaluate=getattr(module, "evaluate", None) is not None,
        has_training_step=getattr(module, "training_step", None) is not None,
        parameters=sum(p.numel() for p in model.parameters()),
        batchnorm_layers=tuple(name for name, m in model.named_modules()
                               if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)),
        blocks=tuple(block_names(model)),
        optimizer=optimizer,
        convolutions=any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules()),
        evaluate_s=evaluate_s,
    )


def _end_descendants() -> None:
    """End every process the user's code started here (a data server, a helper in a
    session of its own): the check must leave nothing running behind it."""
    import psutil

    for child in psutil.Process().children():
        proctree.kill_tree(child.pid)


def _main(argv: list[str]) -> int:
    path, out, *device = argv
    # Orphans of the user's processes re-parent to us, so _end_descendants finds them;
    # and a tuner killed during the check takes the check with it.
    proctree.become_subreaper()
    proctree.die_with_parent()
    result: CheckResult
    try:
        try:
            result = CheckResult(checked=_check(path, device[0] if device else None))
        except ContractError as exc:
            result = CheckResult(error=str(exc))
        Path(out).write_text(json.dumps(result.to_json()))
    finally:
        _end_descendants()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
