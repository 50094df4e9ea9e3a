"""A plain PyTorch training loop run as its user runs it, measured through PyTorch's own doors.

The check, every trial and the emitted ``run_tuned.py`` (which ships this file in
``tuned_runtime/``) run the user's script through ``run_script``: the very file, as
``__main__``, with its own command-line arguments, its source patched as the configuration
says (``loop_patch``: the same edits the user gets as a diff). What is measured comes through
the doors PyTorch offers:

- ``torch.optim.optimizer.register_optimizer_step_post_hook`` marks the end of every step of
  every optimizer (the first to step is the one measured);
- a forward pre-hook on the module whose parameters that optimizer holds counts the samples
  that enter it between two steps (a step's batch, micro-batches summed) and sees whether
  they are images.

Four things PyTorch offers no door for (five where a trial asks for another seed than the
script's: ``torch.manual_seed`` adds it) are done here, and only here, each a wrapper that
calls the original, installed on the class for the life of the process:

- ``Optimizer.__init__``: which line built the optimizer, and which of the script's names
  holds the module it trains (the patch compiles or autocasts that name);
- ``DataLoader.__init__`` and ``__iter__``: which line built the DataLoader the loop draws
  from (the patch sets its arguments there), and its arguments as the user wrote them;
- ``ArgumentParser.parse_known_args``: the script's batch-size flag and its value, so that
  the batch is set where the user sets it;
- ``Tensor.backward``: the loss each step backpropagates (the numerics gate compares them).

A script written for DDP joins its ranks' group itself, where ``script_ranks.join_own_group``
has it meet them.

tests/test_loop_script.py runs them against the torch release the project installs.
"""
from __future__ import annotations

import argparse
import builtins
import dataclasses
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import script_ranks
from .stepper import Stepper

# The flags a script's parser may call its batch size, most specific first.
BATCH_FLAGS = ("--batch-size", "--batch_size", "--train-batch-size", "--train_batch_size", "--bs", "--batch",
               "--micro-batch-size", "--micro_batch_size", "-b")
# The flags a script's parser may set its training's length with: in optimizer steps, in epochs.
STEPS_FLAGS = ("--max-steps", "--max_steps", "--max-iters", "--max_iters", "--train-steps", "--train_steps",
               "--num-steps", "--num_steps", "--iters", "--steps")
EPOCHS_FLAGS = ("--epochs", "--num-epochs", "--num_epochs", "--max-epochs", "--max_epochs", "--n-epochs", "--n_epochs")
# The DataLoader arguments read as the user wrote them (the loader's own attributes after its init).
LOADER_FIELDS = ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor")


@dataclasses.dataclass
class Built:
    """What the script built, filled in as it runs: its optimizers (line, class, the name of
    the module each trains), its DataLoaders (line, arguments), its batch flag, the module and
    DataLoader its training uses."""

    optimizers: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    loaders: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    batch_flag: dict[str, Any] | None = None
    length: dict[str, Any] = dataclasses.field(default_factory=dict)  # max_steps or epochs, as its parser read them
    optimizer: Any = None  # the first to step: the training measured
    stepped: list[Any] = dataclasses.field(default_factory=list)  # every optimizer that stepped
    module: Any = None  # the module ``optimizer`` trains
    module_name: str | None = None
    loader: Any = None  # the DataLoader iterated last before the first step
    samples: int = 0  # samples into ``module`` since the last step
    step_samples: int = 0  # the last step's
    image_inputs: bool = False
    pending: list[Any] = dataclasses.field(default_factory=list)  # losses backpropagated this step
    steps: int = 0

    def optimizer_record(self, optimizer: Any) -> dict[str, Any] | None:
        return next((o for o in self.optimizers if o["id"] == id(optimizer)), None)

    def loader_record(self) -> dict[str, Any] | None:
        return next((d for d in self.loaders if self.loader is not None and d["id"] == id(self.loader)), None)


def _script_line(path: str) -> int | None:
    """The line of ``path`` in the current stack that is running now (innermost)."""
    for frame in reversed(traceback.extract_stack()):
        if frame.filename and os.path.abspath(frame.filename) == path:
            return frame.lineno
    return None


def _script_frame(path: str) -> Any:
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename) != path:
        frame = frame.f_back  # type: ignore[assignment]
    return frame


def _trained_module(frame: Any, params: list[Any]) -> tuple[str | None, Any]:
    """The name in the script's frame (its locals, then its globals) of the module that holds
    the optimizer's parameters: the one that holds all of them with the fewest others."""
    import torch

    want = {id(p) for p in params}
    best: tuple[int, str | None, Any] | None = None
    for scope in (frame.f_locals, frame.f_globals) if frame is not None else ():
        for name, value in list(scope.items()):
            if not isinstance(value, torch.nn.Module) or name.startswith("__"):
                continue
            mine = {id(p) for p in value.parameters()}
            if want <= mine and (best is None or len(mine) < best[0]):
                best = (len(mine), name, value)
        if best is not None:
            return best[1], best[2]
    return None, None


def _first_tensor(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    import torch

    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return value
    return None


def install(script: str, *, on_begin: Callable[[Built], None] = lambda built: None,
            on_step: Callable[[Built, float], None] = lambda built, loss: None, seed_offset: int = 0) -> Built:
    """Install the hooks and wrappers for a run of ``script`` in this process; returns what its
    run will have built. ``on_begin(built)``: the trained module's first forward (the training
    starts); ``on_step(built, loss)``: the end of each of its optimizer's steps. ``seed_offset``:
    another seed than the script's (the quality gate's references): added to each seed it sets."""
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import DataLoader

    script = os.path.abspath(script)
    built = Built()
    optimizer_init = torch.optim.Optimizer.__init__
    loader_init, loader_iter = DataLoader.__init__, DataLoader.__iter__
    parse_known = argparse.ArgumentParser.parse_known_args
    backward = torch.Tensor.backward

    @torch.compiler.disable
    def count(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if module is not built.module or not module.training:
            return  # an evaluation's forward is no training step's
        first = _first_tensor(args, kwargs)
        if first is not None:
            built.samples += int(first.shape[0])
            built.image_inputs = built.image_inputs or (first.dim() == 4 and first.is_floating_point())
        if built.steps == 0 and built.optimizer is None:
            built.steps = -1  # begun
            on_begin(built)

    def __init__(self: Any, params: Any, *args: Any, **kwargs: Any) -> None:
        optimizer_init(self, params, *args, **kwargs)
        line = _script_line(script)
        if line is None:
            return  # an optimizer built by a library, not by the script
        flat = [p for group in self.param_groups for p in group["params"]]
        name, module = _trained_module(_script_frame(script), flat)
        built.optimizers.append({"id": id(self), "line": line, "class": type(self).__name__, "module": name})
        if module is not None and built.module is None:
            built.module, built.module_name = module, name
            module.register_forward_pre_hook(count, with_kwargs=True)

    def loader_init_(self: Any, *args: Any, **kwargs: Any) -> None:
        loader_init(self, *args, **kwargs)
        line = _script_line(script)
        if line is not None:
            values = {k: getattr(self, k, None) for k in LOADER_FIELDS}
            built.loaders.append({"id": id(self), "line": line, "values": values})

    def loader_iter_(self: Any) -> Any:
        if built.optimizer is None and any(d["id"] == id(self) for d in built.loaders):
            built.loader = self
        return loader_iter(self)

    def parse_known_args(self: Any, args: Any = None, namespace: Any = None) -> Any:
        result = parse_known(self, args, namespace)
        if built.batch_flag is None and _script_line(script) is not None:
            built.batch_flag = batch_flag(self, result[0])
            built.length = training_length(self, result[0])
        return result

    def backward_(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.dim() == 0:
            built.pending.append(self.detach())
        return backward(self, *args, **kwargs)

    def step_post(optimizer: Any, args: Any, kwargs: Any) -> None:
        if not any(o is optimizer for o in built.stepped):
            built.stepped.append(optimizer)
        if built.optimizer is None:
            if built.optimizer_record(optimizer) is None:
                return  # a library's optimizer
            built.optimizer = optimizer
            if built.steps == 0:  # no forward of the module was seen: the training begins here
                built.steps = -1
                on_begin(built)
        if optimizer is not built.optimizer:
            return
        loss = float(sum(float(v) for v in built.pending)) if built.pending else float("nan")
        built.pending.clear()
        built.step_samples, built.samples = built.samples, 0
        built.steps = max(built.steps, 0) + 1
        on_step(built, loss)

    script_ranks.join_own_group()
    if seed_offset:
        manual_seed = torch.manual_seed

        def seeded(seed: int) -> Any:
            return manual_seed(int(seed) + seed_offset)

        torch.manual_seed = seeded
        manual_seed(seed_offset)  # a script that sets no seed of its own
    torch.optim.Optimizer.__init__ = __init__  # type: ignore[method-assign]
    DataLoader.__init__ = loader_init_  # type: ignore[method-assign]
    DataLoader.__iter__ = loader_iter_  # type: ignore[method-assign]
    argparse.ArgumentParser.parse_known_args = parse_known_args  # type: ignore[method-assign]
    torch.Tensor.backward = backward_  # type: ignore[method-assign]
    register_optimizer_step_post_hook(step_post)
    return built


def batch_flag(parser: argparse.ArgumentParser, namespace: Any) -> dict[str, Any] | None:
    """The parser's batch-size option (``BATCH_FLAGS``), its value as parsed and whether it
    takes an int; None where it has none."""
    for flag in BATCH_FLAGS:
        for action in parser._actions:
            if flag in action.option_strings:
                long = next((o for o in action.option_strings if o.startswith("--")), flag)
                value = getattr(namespace, action.dest, None)
                return {"flag": long, "dest": action.dest, "value": value if isinstance(value, int) else None}
    return None


def training_length(parser: argparse.ArgumentParser, namespace: Any) -> dict[str, Any]:
    """How long the script trains, as its parser read it: ``max_steps`` (``STEPS_FLAGS``) or
    ``epochs`` (``EPOCHS_FLAGS``), each where it has such a flag with a whole number, and the
    flag that sets each on its command line (``steps_flag``, ``epochs_flag``)."""
    out: dict[str, Any] = {}
    for key, flags, named in (("max_steps", STEPS_FLAGS, "steps_flag"), ("epochs", EPOCHS_FLAGS, "epochs_flag")):
        action = next((a for a in parser._actions if set(a.option_strings) & set(flags)), None)
        value = getattr(namespace, action.dest, None) if action is not None else None
        if action is not None and isinstance(value, int) and not isinstance(value, bool) and value > 0:
            out[key] = value
            out[named] = next((o for o in action.option_strings if o.startswith("--")), action.option_strings[0])
    return out


def synchronize(built: Built) -> None:
    import torch

    module = built.module
    param = next(module.parameters(), None) if module is not None else None
    if param is not None and param.device.type == "cuda":
        torch.cuda.synchronize(param.device)


def run_script(path: str, argv: Sequence[str], edits: Mapping[str, Any] | None = None) -> None:
    """Run the script as ``python path *argv`` would, in this process (its own folder first on
    the import path, ``__main__`` as its name), its source patched by ``edits`` (``loop_patch``)
    and compiled with its own line numbers, so that what it raises names the user's lines."""
    from . import loop_patch

    path = os.path.abspath(path)
    with open(path, encoding="utf-8") as f:
        source = f.read()
    code = loop_patch.compiled(source, edits or {}, path)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(path))
    main = type(sys)("__main__")
    main.__dict__.update({"__file__": path, "__builtins__": builtins, "__name__": "__main__"})
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = main  # pickling in DataLoader workers finds the script's classes
    try:
        exec(code, main.__dict__)
    finally:
        if saved is not None:
            sys.modules["__main__"] = saved


def loop_facts(built: Built) -> dict[str, Any]:
    """What the trial's loop runs with, read from inside it: the loader's arguments, the
    batch a step takes, the module's class and whether its forward is compiled or autocast."""
    import torch

    loader = built.loader
    module = built.module
    forward = getattr(module, "forward", None)
    rank = {"rank": _rank(), "world_size": world_size(), "threads": torch.get_num_threads(),
            "batch": built.step_samples}
    return {
        "loader": {k: getattr(loader, k, None) for k in LOADER_FIELDS} if loader is not None else None,
        "step_samples": built.step_samples,
        "threads": torch.get_num_threads(),
        "module": type(module).__name__ if module is not None else None,
        "compiled": bool(forward is not None and _is_compiled(forward)),
        "autocast": _autocast_dtype(forward),
        "batch_flag": built.batch_flag,
        "world_size": world_size(),
        "ranks": script_ranks.every_rank(rank),
    }


def world_size() -> int:
    """The ranks the script trains as (its process group's size; one without a group)."""
    import torch.distributed as dist

    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _is_compiled(forward: Any) -> bool:
    seen = 0
    while forward is not None and seen < 8:
        if type(forward).__name__ in ("OptimizedModule",) or hasattr(forward, "_torchdynamo_orig_callable"):
            return True
        forward = getattr(forward, "__wrapped__", None)
        seen += 1
    return False


def _autocast_dtype(forward: Any) -> str | None:
    """The dtype of the autocast that wraps ``forward`` (``torch.autocast(...)(fn)``), if any."""
    seen = 0
    while forward is not None and seen < 8:
        closure = getattr(forward, "__closure__", None) or ()
        for cell in closure:
            try:
                value = cell.cell_contents
            except ValueError:
                continue
            if type(value).__name__ == "autocast":
                return str(value.fast_dtype).removeprefix("torch.")
        forward = getattr(forward, "__wrapped__", None) or getattr(forward, "_torchdynamo_orig_callable", None)
        seen += 1
    return None


class NoLoader:
    """What a loop that draws its batches in its own code (no DataLoader) has of one: no workers."""

    num_workers = 0
    prefetch_factor = None


class LoopStepper(Stepper):
    """A plain training loop held at the end of each step of the optimizer it trains with
    (``torch.optim``'s global step post-hook, ``runtime.loop_script``)."""

    train_call = "optimizer.step()"
    prints_metric = True

    def __init__(self, script: str, argv: Sequence[str], overrides: Mapping[str, Any]) -> None:
        edits = overrides.get("edits") or {}
        super().__init__(script, argv, lambda path, args: run_script(path, args, edits))
        self.built = install(self.script, on_begin=self._begin, on_step=self._step,
                                         seed_offset=int(overrides.get("seed") or 0))

    @classmethod
    def for_trial(cls, script: str, argv: Sequence[str], overrides: Mapping[str, Any], *, source_module: str,
                  out_dir: str) -> Stepper:
        return cls(script, argv, overrides)

    def _begin(self, built: Any) -> None:
        self.begin(built.loader if built.loader is not None else NoLoader())

    def _step(self, built: Any, loss: float) -> None:
        synchronize(built)
        self.step_ended(loss)

    @property
    def trainer(self) -> Any:
        return self.built.optimizer

    @property
    def model(self) -> Any:
        return self.built.module

    def global_batch(self) -> int:
        # before its first step ends, what has entered the module so far (a step's first micro-batch);
        # each rank takes its own share
        return int(self.built.step_samples or self.built.samples) * world_size()

    def evaluate(self) -> dict[str, float]:
        raise NotImplementedError("a plain loop's quality is the metric it prints (trials.printed), not a call")

    def facts(self) -> dict[str, Any]:
        return loop_facts(self.built)
