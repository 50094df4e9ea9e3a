"""The user's model file: loading it and checking the contract.

The file is checked before any trial starts. Importing it runs the user's code, so
that happens in a child process (``python -m autotune.task FILE OUT``): a file that
crashes, hangs or exits cannot take the tuner with it. Every violation becomes one
ContractError naming the file, the function and the fix.

The check's step and evaluate() run with the model where the trials put it: cuda:0 when
the checking process sees a GPU. evaluate(model) gets the model on its training device, so
a file whose evaluate() builds its inputs on the CPU fails here, named, and not at the end
of the first epoch of a GPU run.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autotune.errors import ContractError
from autotune.runtime.knobs import Precision
from autotune.space_conditional import DEFAULT_OPTIMIZER
from autotune.trials import proctree

REQUIRED = ("build_model", "build_dataset")
OPTIONAL_FUNCTIONS = (
    "loss_fn", "build_optimizer", "training_step", "collate_fn", "evaluate",
)
CHECK_TIMEOUT_S = 300
# An IterableDataset without a length is read this many of the user's batches far: past
# the largest batch size the search tries (8x the user's, rounded to a power of two),
# so a shorter stream caps the batch sizes and a longer one (or an endless one) needs no cap.
STREAM_LOOKAHEAD_BATCHES = 16
# The folder that holds the autotune package, whether or not it is installed.
PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


@dataclasses.dataclass(frozen=True)
class Task:
    """What the tuner knows about a valid model file."""

    path: Path
    batch_size: int
    # Items per epoch; None for an IterableDataset without a length whose stream runs past
    # STREAM_LOOKAHEAD_BATCHES batches (endless, or too long to count in the check).
    dataset_len: int | None
    image_inputs: bool  # 4-D float inputs: channels_last can apply
    has_evaluate: bool
    parameters: int
    # Names of BatchNorm layers: several ranks would each normalize over their own share
    # of the batch, so a multi-rank layout trains a different model (see space.py).
    batchnorm_layers: tuple[str, ...] = ()
    # Class names of the model's repeated blocks (autotune.runtime.memory.repeated_blocks):
    # what activation checkpointing and sharding act on; none, and those knobs cannot apply.
    blocks: tuple[str, ...] = ()
    # The file calls the model its own way (training_step): the tuner cannot call it on a
    # batch's inputs, which tracing the model for pruning needs.
    has_training_step: bool = False
    # The optimizer's class as build_optimizer(params) builds it (module.qualname; torch's
    # AdamW, the runtime's own, without one): whether its step can be fused
    # (autotune.space_conditional), known here without building it again.
    optimizer: str = DEFAULT_OPTIMIZER
    check_s: float = 0.0  # how long the check took: import, build_dataset, build_model, a step


def with_package_on_path(env: Mapping[str, str], package_root: str = PACKAGE_ROOT) -> dict[str, str]:
    """A copy of ``env`` whose PYTHONPATH starts with ``package_root``, so that a child
    started with it runs ``python -m autotune.…`` from this source tree; the PYTHONPATH
    already in ``env`` is kept after it."""
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))}


def load_task(path: str | os.PathLike[str], *, timeout_s: float = CHECK_TIMEOUT_S,
              device: str | None = None) -> Task:
    """Check the model file and describe it, or raise ContractError. ``device`` is where
    the check puts the model; None: where the trials would (see check_device)."""
    path = Path(path)
    _check_source(path)
    started = time.monotonic()
    result = _run_check(path, timeout_s, device)
    if result.get("error"):
        raise ContractError(result["error"])
    described = result["task"]
    described["batchnorm_layers"] = tuple(described.get("batchnorm_layers", ()))
    described["blocks"] = tuple(described.get("blocks", ()))
    return Task(path=path.resolve(), check_s=time.monotonic() - started, **described)


def _check_source(path: Path) -> None:
    """What can be checked without running the file: it exists, reads and compiles."""
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


def _run_check(path: Path, timeout_s: float, device: str | None = None) -> dict[str, Any]:
    """Run the check in a child process; returns what it wrote: {"task": fields} or
    {"error": message}. Raises ContractError if it times out or dies without writing."""
    with tempfile.TemporaryDirectory(prefix="autotune-check-") as tmp:
        out = Path(tmp) / "result.json"
        log = Path(tmp) / "log.txt"
        # Output goes to a file, not a pipe: a process the user's code leaves running would
        # hold a pipe open and keep us waiting for its end instead of the check's.
        with open(log, "wb") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "-m", "autotune.task", str(path.resolve()), str(out),
                 *([device] if device else [])],
                stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                env=with_package_on_path(os.environ), start_new_session=True,
            )
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                # Still running, so its whole tree can be found: end all of it. (When the
                # check ends by itself, it ends what it started: see _main.)
                proctree.kill_tree(proc.pid)
                proc.wait()
                raise ContractError(
                    f"{path}: checking the file took over {timeout_s:.0f} s (importing it, building "
                    "the model and dataset, one training step). Make build_model/build_dataset quick."
                ) from None
        if not out.exists():
            text = log.read_text(errors="replace")
            tail = "\n".join(text.strip().splitlines()[-5:])
            raise ContractError(
                f"{path}: the process checking the file ended abruptly (exit code "
                f"{proc.returncode}) while importing or calling it.\n{tail}"
            )
        return json.loads(out.read_text())


# --- what runs in the child process -------------------------------------------------


def _user_frames(tb: str, path: str) -> str:
    """The user's own part of a traceback: from their file's first frame on."""
    lines = tb.strip().splitlines()
    for i, line in enumerate(lines):
        if path in line:
            return "\n".join(["Traceback (most recent call last):", *lines[i:]][-12:])
    return "\n".join(lines[-6:])


def _is_nested_tensors(obj: Any) -> bool:
    """True for a tensor or number, or a list, tuple or dict of them (at any depth):
    what default_collate can stack and the runtime can move to a device."""
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


@dataclasses.dataclass(frozen=True)
class _UserFile:
    """The model file being checked: its path and the name messages show for it."""

    path: str
    shown: str

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """Call the user's ``fn``; an error it raises becomes a ContractError naming
        ``what`` and showing the user's own frames of the traceback."""
        try:
            return fn(*args)
        except (Exception, SystemExit):  # the user's error, shown as theirs
            raise ContractError(
                f"{self.shown}: {what} raised an error:\n"
                f"{_user_frames(traceback.format_exc(), self.path)}"
            ) from None


def check_device() -> str:
    """Where the trials put the model, so where the check does: the first GPU when this
    process sees one (a trial's single rank, and rank 0 of several, use cuda:0)."""
    import torch

    return "cuda:0" if torch.cuda.is_available() else "cpu"


def _place(model: Any, device: str) -> Any:
    """The model on ``device``, as a trial moves it before building the optimizer."""
    return model.to(device)


def _check(path: str, device: str | None = None) -> dict[str, Any]:
    """The contract, checked in order, with the model on ``device`` (None: check_device());
    returns the Task fields or raises ContractError."""
    file = _UserFile(path=path, shown=os.path.relpath(path))
    device = device or check_device()
    module = _import(file)
    _check_functions(file, module)
    batch_size = _check_batch_size(file, module)
    model = _place(_check_model(file, module), device)
    dataset = _check_dataset(file, module)
    if _is_stream(dataset):
        items, n = _check_stream(file, dataset, batch_size)
    else:
        n = _check_dataset_len(file, file.call("len(build_dataset())", len, dataset), batch_size)
        items = [file.call(f"build_dataset()[{i}]", dataset.__getitem__, i) for i in (0, 1)]
    has_training_step = getattr(module, "training_step", None) is not None
    if not has_training_step:
        _check_item_is_pair(file, items[0])
    optimizer = _check_training_step(file, module, model, items, has_training_step, device)
    if getattr(module, "evaluate", None) is not None:
        _check_evaluate(file, module, model, device)
    return {**_describe(module, model, items[0], batch_size=batch_size, dataset_len=n), "optimizer": optimizer}


def _import(file: _UserFile) -> Any:
    """Import the model file; an error or sys.exit() at import becomes a ContractError."""
    from autotune.runtime.session import load_user_module

    try:
        return load_user_module(file.path)
    except (Exception, SystemExit):  # sys.exit() at import, too
        raise ContractError(
            f"{file.shown}: importing the file raised an error:\n"
            f"{_user_frames(traceback.format_exc(), file.path)}"
        ) from None


def _check_functions(file: _UserFile, module: Any) -> None:
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


def _check_batch_size(file: _UserFile, module: Any) -> int:
    """The file's batch_size (32 if it sets none), which must be a positive int."""
    batch_size = getattr(module, "batch_size", 32)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ContractError(
            f"{file.shown}: batch_size = {batch_size!r}; expected a positive integer "
            "(the batch size you train with today), e.g. `batch_size = 32`."
        )
    return batch_size


def _check_model(file: _UserFile, module: Any) -> Any:
    """build_model() runs and returns a torch.nn.Module."""
    import torch

    model = file.call("build_model()", module.build_model)
    if not isinstance(model, torch.nn.Module):
        raise ContractError(
            f"{file.shown}: build_model() returned {type(model).__name__}; expected a "
            "torch.nn.Module. Return the model instance, e.g. `return MyNet()`."
        )
    return model


def _is_stream(dataset: Any) -> bool:
    import torch

    return isinstance(dataset, torch.utils.data.IterableDataset)


def _check_dataset(file: _UserFile, module: Any) -> Any:
    """build_dataset() runs and returns a map-style dataset or an IterableDataset."""
    dataset = file.call("build_dataset()", module.build_dataset)
    # A plain list/tuple/dict is not a Dataset (the contract asks for one; a dict "works"
    # only by accident of its keys); nor is a generator, which one epoch would use up.
    if _is_stream(dataset):
        return dataset
    if isinstance(dataset, (list, tuple, dict)) or not (
        hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
    ):
        raise ContractError(
            f"{file.shown}: build_dataset() returned {type(dataset).__name__}; expected a map-style "
            "torch.utils.data.Dataset (with __len__ and __getitem__), e.g. a TensorDataset, or a "
            "torch.utils.data.IterableDataset."
        )
    return dataset


def _check_stream(file: _UserFile, dataset: Any, batch_size: int) -> tuple[list[Any], int | None]:
    """An IterableDataset's first two items and its length: len() where it has one, else
    the items counted up to STREAM_LOOKAHEAD_BATCHES batches (None: the stream is longer)."""
    sized = hasattr(type(dataset), "__len__")
    n = _check_dataset_len(file, file.call("len(build_dataset())", len, dataset), batch_size) if sized else None
    limit = 2 if sized else batch_size * STREAM_LOOKAHEAD_BATCHES
    items = file.call("iterating over build_dataset()",
                      lambda: list(itertools.islice(iter(dataset), limit)))
    if len(items) < 2:
        raise ContractError(
            f"{file.shown}: iterating over build_dataset() gave {len(items)} item(s); need at least 2."
        )
    if not sized and len(items) < limit:
        n = _check_dataset_len(file, len(items), batch_size)
    return items[:2], n


def _check_dataset_len(file: _UserFile, n: int, batch_size: int) -> int:
    """The dataset's length: at least 2 items (the check's batch) and one full batch."""
    if n < 2:
        raise ContractError(f"{file.shown}: build_dataset() returned a dataset of {n} items; need at least 2.")
    if n < batch_size:
        # Every epoch drops its ragged last batch: no batch of batch_size would ever run.
        raise ContractError(
            f"{file.shown}: build_dataset() returned {n} items, fewer than batch_size = {batch_size}; "
            "expected at least one full batch. Lower batch_size or return more items."
        )
    return n


def _check_item_is_pair(file: _UserFile, item: Any) -> None:
    """Without a training_step, an item is an (inputs, targets) pair of tensors (or
    nested tuples/lists/dicts of them): the default step unpacks it that way."""
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        raise ContractError(
            f"{file.shown}: build_dataset()[0] is a {type(item).__name__}"
            + (f" of {len(item)} elements" if isinstance(item, (tuple, list)) else "")
            + "; expected an (inputs, targets) pair. Return `(inputs, targets)` from "
            "__getitem__, or define training_step(model, batch) for another layout."
        )
    if not _is_nested_tensors(item[0]) or not _is_nested_tensors(item[1]):
        raise ContractError(
            f"{file.shown}: build_dataset()[0] holds {type(item[0]).__name__} inputs and "
            f"{type(item[1]).__name__} targets; expected tensors (or tuples/lists/dicts of them)."
        )


def _check_optimizer(file: _UserFile, module: Any, model: Any) -> Any:
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


def _check_training_step(file: _UserFile, module: Any, model: Any, items: list[Any],
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


def _check_evaluate(file: _UserFile, module: Any, model: Any, device: str = "cpu") -> None:
    """evaluate(model) runs, with the model on ``device``, and returns a number (a 1-element
    tensor counts as one)."""
    import torch

    try:
        score = file.call("evaluate(model)", module.evaluate, model)
    except ContractError as exc:
        if device == "cpu" or not _names_a_device(str(exc)):
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


def _names_a_device(message: str) -> bool:
    """Whether torch's error is about tensors on different devices ("Expected all tensors
    to be on the same device", "Input type (torch.FloatTensor) and weight type
    (torch.cuda.FloatTensor)", "Tensor on device meta is not on the expected device cpu")."""
    if "out of memory" in message:  # CUDA's own message names the device too
        return False
    return "device" in message or "weight type" in message


def _describe(module: Any, model: Any, item: Any, *, batch_size: int,
              dataset_len: int | None) -> dict[str, Any]:
    """The Task fields of a file that passed every check (all but path and check_s)."""
    import torch

    from autotune.runtime.data import tensors
    from autotune.runtime.memory import block_names

    # An (inputs, targets) pair's inputs; any other item (a dict for training_step) whole:
    # its image need not come first, e.g. {"labels": ..., "pixel_values": ...}.
    inputs = item[0] if isinstance(item, (tuple, list)) and len(item) == 2 else item
    return {
        "batch_size": batch_size,
        "dataset_len": dataset_len,
        # One item's 3-D float input is a 4-D batch: an image layout channels_last applies to.
        "image_inputs": any(t.dim() == 3 and t.is_floating_point() for t in tensors(inputs)),
        "has_evaluate": getattr(module, "evaluate", None) is not None,
        "has_training_step": getattr(module, "training_step", None) is not None,
        "parameters": sum(p.numel() for p in model.parameters()),
        "batchnorm_layers": [name for name, m in model.named_modules()
                             if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)],
        "blocks": list(block_names(model)),
    }


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
    result: dict[str, Any]
    try:
        try:
            result = {"task": _check(path, device[0] if device else None)}
        except ContractError as exc:
            result = {"error": str(exc)}
        Path(out).write_text(json.dumps(result))
    finally:
        _end_descendants()
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
