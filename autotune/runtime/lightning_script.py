"""A Lightning script run as its user runs it, with its ``Trainer``'s arguments and its
training DataLoader's overridden and a ``Callback`` of ours inside ``fit``.

The check, every trial and the emitted ``run_tuned.py`` (which ships this file in
``tuned_runtime/``) run the user's script through ``run_script``: the very file, as
``__main__``, with its own command-line arguments. Lightning is entered through the doors it
offers where it has them:

- the batch size goes where Lightning's own batch-size finder puts it
  (``lightning_setattr``: a ``batch_size`` attribute or hyperparameter of the DataModule or
  the LightningModule), from our Callback's ``setup``, before ``train_dataloader()`` is asked;
- ``torch.compile`` of the LightningModule is ``fit(torch.compile(model))``, which Lightning
  takes as its documented way to compile (its ``self.log`` kept out of the graph:
  ``keep_logging_eager``);
- steps are counted, their losses kept and the fit held at ``on_train_batch_end``.

Three things it offers no door for are done here, and only here. The script builds its own
``Trainer`` and calls its own ``fit``, so ``Trainer.__init__`` is wrapped to set the
configuration's arguments (and, in a trial, no logger, checkpoint or progress bar) as if the
user had written them, and ``Trainer.fit`` is wrapped to see what it trains: its model, and the
DataLoader it trains on, made again from the user's own (its dataset, sampler or shuffle,
collate function, drop_last) with the configuration's workers, pinning and prefetch.
Evaluating mid-fit for the quality gate runs Lightning's own validation loop the way its
training loop does at a ``val_check_interval`` (``validate_now``).

The wrappers call the originals, are installed on the classes for the life of the process,
and are run against the lightning release the project installs by tests/test_lightning_script.py.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import math
import os
import runpy
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from . import script_ranks
from .stepper import Stepper

# The Trainer keyword arguments autotune reads from the user's Trainer (their baseline) and may set.
TRAINER_FIELDS = ("precision", "accumulate_grad_batches", "benchmark", "accelerator", "devices", "strategy",
                  "num_nodes", "deterministic", "max_epochs", "max_steps", "limit_train_batches", "gradient_clip_val")
# The DataLoader arguments autotune reads from the user's training DataLoader and may set.
LOADER_FIELDS = ("batch_size", "num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "drop_last")
# In a trial (and the check) the script logs to nothing, saves no checkpoint, shows no bar,
# validates only when a gate asks (``validate_now``), and trains until autotune has measured it.
ENDLESS = 10**9
QUIET: dict[str, Any] = {
    "logger": False, "enable_checkpointing": False, "enable_progress_bar": False, "enable_model_summary": False,
    "num_sanity_val_steps": 0, "check_val_every_n_epoch": None, "val_check_interval": ENDLESS,
    "max_epochs": -1, "max_steps": -1, "max_time": None,
}
# Callbacks that save, stop, log or draw: dropped from a quiet Trainer (with enable_checkpointing
# off, Lightning refuses a ModelCheckpoint; without a logger, a LearningRateMonitor).
QUIET_DROPS = ("Checkpoint", "EarlyStopping", "ProgressBar", "ModelSummary", "LearningRateMonitor",
               "DeviceStatsMonitor")


def package(source_module: str) -> Any:
    """``lightning.pytorch`` or ``pytorch_lightning``: the one the script imports."""
    return importlib.import_module("pytorch_lightning" if source_module == "pytorch_lightning" else "lightning.pytorch")


def plain(value: Any) -> Any:
    value = getattr(value, "value", value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, tuple)) and all(isinstance(v, (str, int)) for v in value):
        return list(value)
    return type(value).__name__  # a strategy or accelerator object: its class names it


@dataclasses.dataclass
class Built:
    """What the script built, as it wrote it: its Trainer's arguments, the lines that built
    the Trainer and called ``fit``, its training DataLoader, and where its batch size lives."""

    trainer_values: dict[str, Any] = dataclasses.field(default_factory=dict)
    trainer_line: int | None = None
    fit_lines: list[int] = dataclasses.field(default_factory=list)
    monitor: str | None = None  # what its ModelCheckpoint or EarlyStopping watches
    mode: str | None = None
    loader_values: dict[str, Any] = dataclasses.field(default_factory=dict)
    loader_kind: str = ""  # "DataLoader", else the type the script's train_dataloader() gives
    loader_source: str = ""  # "fit", "datamodule" or "model": where the training data comes from
    batch_holder: str | None = None  # e.g. "datamodule.batch_size"; None: nowhere to set it
    seed: int | None = None
    trainer: Any = None
    trainers: int = 0
    has_val: bool = False


def _script_line(path: str) -> int | None:
    path = os.path.abspath(path)
    for frame in reversed(traceback.extract_stack()):
        if frame.filename and os.path.abspath(frame.filename) == path:
            return frame.lineno
    return None


def loader_values(loader: Any) -> dict[str, Any]:
    """A DataLoader's arguments that autotune reads and sets, as it holds them."""
    from torch.utils.data import RandomSampler

    values = {k: plain(getattr(loader, k, None)) for k in LOADER_FIELDS}
    values["batch_size"] = batch_size(loader)
    values["shuffle"] = isinstance(getattr(loader, "sampler", None), RandomSampler)
    return values


def remake(loader: Any, settings: Mapping[str, Any]) -> Any:
    """The user's DataLoader made again with ``settings`` (workers, pinning, prefetch): its
    dataset, its sampler or batch sampler, collate function, drop_last and the rest as it has
    them. Anything but a plain ``torch.utils.data.DataLoader`` is handed back as it is."""
    from torch.utils.data import BatchSampler, DataLoader

    if type(loader) is not DataLoader or not settings:
        return loader
    own_batches = loader.batch_size is None or type(loader.batch_sampler) is not BatchSampler
    kwargs: dict[str, Any] = {
        "collate_fn": loader.collate_fn, "worker_init_fn": loader.worker_init_fn, "generator": loader.generator,
        "timeout": loader.timeout, "multiprocessing_context": loader.multiprocessing_context,
        "num_workers": loader.num_workers, "pin_memory": loader.pin_memory,
        "persistent_workers": loader.persistent_workers,
    }
    if own_batches:
        kwargs["batch_sampler"] = loader.batch_sampler
    else:
        kwargs.update(batch_size=loader.batch_size, sampler=loader.sampler, drop_last=loader.drop_last)
    if loader.num_workers:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    kwargs.update(settings)
    if not kwargs["num_workers"]:
        kwargs.pop("prefetch_factor", None)
        kwargs["persistent_workers"] = False
    return DataLoader(loader.dataset, **kwargs)


def batch_size(loader: Any) -> int | None:
    """The loader's batch, whether it batches itself or through a batch sampler that says it."""
    return getattr(loader, "batch_size", None) or getattr(getattr(loader, "batch_sampler", None), "batch_size", None)


def _batch_holders(module: Any, datamodule: Any) -> list[str]:
    """Where a ``batch_size`` is, in the order Lightning's batch-size finder looks."""
    holders = []
    for name, obj in (("model", module), ("datamodule", datamodule)):
        if obj is None:
            continue
        hparams = getattr(obj, "hparams", None)
        if hparams is not None and "batch_size" in hparams:
            holders.append(f"{name}.hparams.batch_size")
        if hasattr(obj, "batch_size"):
            holders.append(f"{name}.batch_size")
    return holders


def install(script: str, overrides: Mapping[str, Any], callbacks: Callable[[Any], Sequence[Any]] = lambda t: (),
            *, source_module: str = "lightning", quiet: bool = False, out_dir: str | None = None,
            at_end: Callable[[], Any] | None = None) -> Built:
    """Wrap ``Trainer.__init__`` (the overrides' Trainer arguments, ``callbacks(trainer)`` added,
    and with ``quiet`` what a trial sets) and ``Trainer.fit`` (compile, seed, the remade
    DataLoader; once the fit has returned, ``at_end()``, which does not return: ``script_end``)
    for this process; returns what the script's run will have built, filled in as it builds it. ``overrides``:
    ``trainer`` and ``loader`` (keyword arguments), ``batch_size``, ``compile`` (a
    torch.compile mode, "default", or absent), ``seed``, ``matmul_precision``."""
    pl = package(source_module)
    built = Built()
    trainer_class = pl.Trainer
    init, fit = trainer_class.__init__, trainer_class.fit
    fit_signature = inspect.signature(fit)
    trainer_overrides = dict(overrides.get("trainer", {}))
    loader_overrides = dict(overrides.get("loader", {}))

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        first = built.trainers == 0
        built.trainers += 1
        if first:
            built.trainer_values = {k: plain(kwargs[k]) for k in TRAINER_FIELDS if k in kwargs}
            built.trainer_line = _script_line(script)
            for callback in kwargs.get("callbacks") or []:
                if getattr(callback, "monitor", None) and built.monitor is None:
                    built.monitor, built.mode = str(callback.monitor), str(getattr(callback, "mode", "min"))
        if not first:
            return init(self, *args, **kwargs)
        own = list(kwargs.get("callbacks") or [])
        if quiet:
            kwargs.update(QUIET)
            kwargs["default_root_dir"] = out_dir or kwargs.get("default_root_dir")
            own = [c for c in own if not any(d in type(c).__name__ for d in QUIET_DROPS)]
            # one process, as measured: Lightning's own launcher would start the others as the bare
            # script, without these hooks
            kwargs["devices"] = 1
        kwargs.update(trainer_overrides)  # after QUIET: a timed run's max_steps
        kwargs["callbacks"] = own
        init(self, *args, **kwargs)
        built.trainer = self
        for callback in (_BatchSetter(pl, set_batch), *callbacks(self)):
            self.callbacks.append(callback)

    def fit_(self: Any, *args: Any, **kwargs: Any) -> Any:
        built.fit_lines.append(_script_line(script) or 0)
        if self is not built.trainer:
            return fit(self, *args, **kwargs)
        bound = fit_signature.bind(self, *args, **kwargs)
        a = bound.arguments
        model, datamodule = a["model"], a.get("datamodule")
        train = a.get("train_dataloaders")
        if train is not None and hasattr(train, "train_dataloader"):  # a DataModule passed first
            datamodule, train = train, None
            a["datamodule"], a["train_dataloaders"] = datamodule, None
        built.has_val = a.get("val_dataloaders") is not None or any(
            _overrides_hook(obj, "val_dataloader") for obj in (datamodule, model) if obj is not None)
        holders = _batch_holders(model, datamodule)
        built.batch_holder = holders[-1] if holders else None
        built.seed = int(os.environ["PL_GLOBAL_SEED"]) if os.environ.get("PL_GLOBAL_SEED", "").isdigit() else None

        def seen(loader: Any) -> Any:
            built.loader_kind = "DataLoader" if type(loader).__name__ == "DataLoader" else type(loader).__name__
            built.loader_values = loader_values(loader) if built.loader_kind == "DataLoader" else {}
            return remake(loader, loader_overrides)

        if train is not None:
            built.loader_source = "fit"
            a["train_dataloaders"] = seen(train)
        else:
            holder = datamodule if datamodule is not None and _overrides_hook(datamodule, "train_dataloader") else model
            built.loader_source = "datamodule" if holder is datamodule else "model"
            own = holder.train_dataloader

            @functools.wraps(own)
            def train_dataloader() -> Any:
                return seen(own())

            holder.train_dataloader = train_dataloader
        if "seed" in overrides:
            pl.seed_everything(int(overrides["seed"]), verbose=False)
        if overrides.get("matmul_precision"):
            import torch

            torch.set_float32_matmul_precision(str(overrides["matmul_precision"]))
        if overrides.get("compile"):
            import torch

            mode = overrides["compile"]
            keep_logging_eager(model)
            a["model"] = torch.compile(model, **({} if mode == "default" else {"mode": mode}))
        result = fit(*bound.args, **bound.kwargs)
        if at_end is not None:
            at_end()  # nothing of the script after its training (saving, testing) runs (script_end)
        return result

    def set_batch(module: Any) -> None:
        if "batch_size" in overrides and built.batch_holder is not None:
            parsing = importlib.import_module(pl.__name__ + ".utilities.parsing")
            parsing.lightning_setattr(module, "batch_size", int(overrides["batch_size"]))

    trainer_class.__init__ = __init__
    trainer_class.fit = fit_
    return built


def keep_logging_eager(module: Any) -> None:
    """``self.log`` and ``self.log_dict`` of ``module`` run outside the compiled graph: Lightning's
    ``log`` reads the hook's signature (``inspect``), which dynamo cannot trace (torch 2.13
    fails the whole step on it); a graph break there costs one call a step."""
    import torch

    for name in ("log", "log_dict"):
        setattr(module, name, torch.compiler.disable(getattr(module, name)))


def _overrides_hook(obj: Any, name: str) -> bool:
    """Whether ``obj`` (a DataModule or LightningModule) defines the hook ``name`` itself."""
    method = getattr(type(obj), name, None)
    if method is None:
        return False
    return any(name in vars(k) for k in type(obj).__mro__
               if k.__module__.split(".")[0] not in ("lightning", "pytorch_lightning"))


def _BatchSetter(pl: Any, set_batch: Callable[[Any], None]) -> Any:
    class BatchSize(pl.Callback):
        """Sets the configuration's batch size where Lightning's batch-size finder would, once
        the DataModule is attached and before ``train_dataloader()`` is asked for."""

        def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
            if stage == "fit":
                set_batch(pl_module)

    return BatchSize()


def step_loss(outputs: Any) -> Any:
    """The loss ``training_step`` returned, as ``on_train_batch_end`` gets it (unscaled by
    accumulation); None where the step was skipped."""
    if isinstance(outputs, Mapping):
        return outputs.get("loss")
    return outputs


def validate_now(trainer: Any) -> dict[str, float]:
    """Run the Trainer's validation loop now, from inside ``fit`` (at a batch's end, in its own
    thread), as its training loop does at a ``val_check_interval``; returns the metrics it logged."""
    loop = trainer.fit_loop.epoch_loop
    trainer.validating = True
    first = trainer._logger_connector._first_loop_iter
    try:
        loop.val_loop.run()
    finally:
        trainer.training = True
        trainer._logger_connector._first_loop_iter = first
    return {k: float(v) for k, v in trainer.callback_metrics.items() if getattr(v, "numel", lambda: 1)() == 1}


def global_batch(trainer: Any) -> int:
    """Samples an optimizer step trains on: the loader's batch × accumulation × ranks."""
    batch = batch_size(trainer.train_dataloader) or 1
    return int(batch) * int(trainer.accumulate_grad_batches) * int(trainer.world_size)


def trainer_facts(trainer: Any) -> dict[str, Any]:
    """The arguments as the Trainer and its DataLoader run with them, read from inside ``fit``:
    what a trial, the check and run_tuned.py --report record; with several ranks, what each
    rank runs with (``ranks``: a collective, every rank calls it at the same point)."""
    import torch

    module = trainer.lightning_module
    loader = trainer.train_dataloader
    precision = getattr(trainer.precision_plugin, "precision", None) if hasattr(trainer, "precision_plugin") else None
    return {"trainer": {"precision": plain(precision or trainer.precision),
                        "accumulate_grad_batches": int(trainer.accumulate_grad_batches),
                        "benchmark": _benchmark(), "world_size": int(trainer.world_size),
                        "accelerator": type(trainer.accelerator).__name__,
                        "loggers": len(trainer.loggers), "checkpointing": trainer.checkpoint_callback is not None},
            "loader": loader_values(loader) if type(loader).__name__ == "DataLoader" else {},
            "compiled": getattr(module, "_compiler_ctx", None) is not None,
            "matmul_precision": _matmul_precision(),
            "default_root_dir": str(trainer.default_root_dir),
            "ranks": script_ranks.every_rank({"rank": int(trainer.global_rank), "world_size": int(trainer.world_size),
                                              "threads": torch.get_num_threads(),
                                              "batch_size": batch_size(loader)})}


def _benchmark() -> bool:
    import torch

    return bool(torch.backends.cudnn.benchmark)


def _matmul_precision() -> str:
    import torch

    return str(torch.get_float32_matmul_precision())


def run_script(path: str, argv: Sequence[str]) -> None:
    """Run the script as ``python path *argv`` would, in this process: its own folder first on
    the import path, ``__main__`` as its name."""
    path = os.path.abspath(path)
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(path))
    runpy.run_path(path, run_name="__main__")


def synchronize(trainer: Any) -> None:
    import torch

    root = getattr(trainer.strategy, "root_device", None)
    if root is not None and root.type == "cuda":
        torch.cuda.synchronize(root)


class LightningStepper(Stepper):
    """A Lightning Trainer held at each optimizer step's ``on_train_batch_end`` (a ``Callback``)."""

    train_call = "Trainer.fit()"

    def __init__(self, script: str, argv: Sequence[str], overrides: Mapping[str, Any], *,
                 source_module: str, out_dir: str) -> None:
        super().__init__(script, argv, run_script)
        self.pl = package(source_module)
        self.built = install(self.script, overrides, self._callbacks, source_module=source_module,
                                              quiet=True, out_dir=out_dir, at_end=self.training_over)

    @classmethod
    def for_trial(cls, script: str, argv: Sequence[str], overrides: Mapping[str, Any], *, source_module: str,
                  out_dir: str) -> Stepper:
        return cls(script, argv, overrides, source_module=source_module, out_dir=out_dir)

    def _callbacks(self, trainer: Any) -> Sequence[Any]:
        stepper = self
        pending: list[Any] = []

        class StepByStep(self.pl.Callback):  # type: ignore[name-defined]
            last = 0

            def on_train_start(self, trainer: Any, pl_module: Any) -> None:
                self.last = trainer.global_step
                stepper.begin(trainer.train_dataloader)

            def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any,
                                   batch_idx: int) -> None:
                loss = step_loss(outputs)
                if loss is not None:
                    pending.append(loss)
                if trainer.global_step == self.last:
                    return  # accumulating: the optimizer has not stepped yet
                self.last = trainer.global_step
                value = sum(float(v) for v in pending) / len(pending) if pending else math.nan
                pending.clear()
                synchronize(trainer)
                stepper.step_ended(value)

        return (StepByStep(),)

    @property
    def model(self) -> Any:
        return self.trainer.lightning_module

    def global_batch(self) -> int:
        return global_batch(self.trainer)

    def evaluate(self) -> dict[str, float]:
        return self.in_script(lambda: validate_now(self.trainer))

    def facts(self) -> dict[str, Any]:
        return trainer_facts(self.trainer)
