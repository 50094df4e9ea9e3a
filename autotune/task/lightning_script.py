"""The third way in: a Lightning script the user already runs.

A file that imports ``lightning`` (or ``pytorch_lightning``) and calls ``X.fit(...)`` is
recognised by its source and checked in a child process (``python -m
autotune.task.lightning_script SCRIPT OUT [ARGS]``): the script runs as its user runs it, with
``runtime.lightning_script``'s hooks, up to two optimizer steps inside its ``fit``, and what it
built is written back (``LightningFacts``). Trials run it the same way with ``overrides`` for
their configuration; the baseline is the script as written.
"""
from __future__ import annotations

import ast
import dataclasses
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from autotune.config import TrialConfig
from autotune.errors import ContractError
from autotune.runtime.json_value import JsonObject, JsonValue
from autotune.runtime.knobs import CompileMode, Device, Precision
from autotune.schemas.typed import Record
from autotune.task.way_in import WayIn
from autotune.user_file import _user_frames, in_loop

KIND = "lightning"
PACKAGES = ("lightning", "pytorch_lightning")
# The knobs a Lightning script cannot be told through its Trainer, its DataLoader or its
# process, and why: named as skipped by the space.
NOT_EXPRESSIBLE = {
    "channels_last": "a Lightning script: its LightningModule lays out its own tensors",
    "prune_ratio": "a Lightning script: pruning changes the model the script builds",
    "interop_threads": "a Lightning script: no Trainer argument or environment variable sets it",
    "ipex": "a Lightning script: IPEX ended with intel-extension-for-pytorch 2.8",
    "activation_checkpointing": "a Lightning script: its LightningModule would checkpoint its own blocks",
    "sharding": "a Lightning script: FSDP through the Trainer's strategy is not searched yet",
    "ddp_bucket_view": "a Lightning script: DDPStrategy's options are not searched yet",
    "ddp_static_graph": "a Lightning script: DDPStrategy's options are not searched yet",
    "optimizer_step": "a Lightning script: configure_optimizers() builds its own optimizer",
}
# The user's Trainer precision as a configuration's; others ("bf16-true", "64-true", ...) are kept.
PRECISIONS = {None: Precision.FP32, "32": Precision.FP32, "32-true": Precision.FP32,
              "bf16": Precision.BF16, "bf16-mixed": Precision.BF16, "16": Precision.FP16, "16-mixed": Precision.FP16}
TRAINER_PRECISION = {Precision.FP32: "32-true", Precision.TF32: "32-true", Precision.BF16: "bf16-mixed",
                     Precision.FP16: "16-mixed"}


@dataclasses.dataclass(frozen=True)
class LightningFacts(Record):
    """A Lightning script as its check saw it: the arguments it was given, the package it
    imports, the lines that built its Trainer, called ``fit`` and built its training
    DataLoader, the Trainer's and the DataLoader's arguments as the user wrote them, where its
    batch size lives, and what it trains and validates."""

    argv: tuple[str, ...] = ()
    source_module: str = "lightning"
    trainer_line: int | None = None
    fit_line: int | None = None
    loader_line: int | None = None
    trainer_values: JsonObject = dataclasses.field(default_factory=dict)
    loader_values: JsonObject = dataclasses.field(default_factory=dict)
    loader_kind: str = "DataLoader"
    loader_source: str = "datamodule"
    batch_holder: str | None = None
    compiled: bool = False
    has_eval: bool = False
    metric: str = "val_loss"
    greater_is_better: bool = False
    model_class: str = ""
    parameters: int = 0
    dataset_len: int | None = None
    seed: int | None = None

    kind = KIND
    parsed = False  # its arguments are in code, said as keyword arguments
    stack = "Trainer and DataLoader arguments"
    unjudged = ("without a validation loop in the script", "give its LightningModule a validation_step")
    length_keys = ("max_steps", "max_epochs")
    stepper = "autotune.runtime.lightning_script:LightningStepper"
    template = "run_tuned_lightning.py"
    hooks = ("lightning_script.py",)

    # Lightning's DDP hands each rank a DistributedSampler's share of its own shuffle (seeded at
    # its setup), not one process's order: a step's losses on its ranks cannot be compared
    # with one process's, so the quality check judges its layouts (``verify.numerics``).
    no_ranks = None
    ranks_reorder = True

    @property
    def args_line(self) -> int | None:
        return self.trainer_line

    @property
    def user_values(self) -> JsonObject:
        return {"seed": self.seed, **self.trainer_values}

    @property
    def per_device(self) -> int:
        value = self.loader_values.get("batch_size")
        return int(value) if isinstance(value, int) and value > 0 else 1

    @property
    def accumulation(self) -> int:
        value = self.trainer_values.get("accumulate_grad_batches")
        return int(value) if isinstance(value, int) and value > 0 else 1

    @property
    def precision(self) -> Precision | None:
        """The user's precision as a configuration's; None where it is one autotune keeps."""
        value = self.trainer_values.get("precision")
        return PRECISIONS.get(None if value is None else str(value))

    @property
    def a_loader(self) -> bool:
        return self.loader_kind == "DataLoader"

    @property
    def scored_by(self) -> str:
        return self.metric

    def describe(self) -> str:
        source = {"fit": "DataLoaders passed to fit", "datamodule": "a LightningDataModule",
                  "model": "the LightningModule's train_dataloader()"}.get(self.loader_source, self.loader_source)
        batch = f"batch_size in {self.batch_holder}" if self.batch_holder else "no batch_size attribute"
        val = f", validated by {self.metric}" if self.has_eval else ""
        return (f"a Lightning script ({self.model_class}, {source}, {batch}{val}): trials run it with its Trainer "
                "and DataLoader arguments overridden, measured inside its fit")

    def skipped(self) -> dict[str, str]:
        """The knobs this script cannot take, with the reason: what ``NOT_EXPRESSIBLE`` says of
        every Lightning script, and what its own Trainer and DataLoader rule out."""
        out = dict(NOT_EXPRESSIBLE)
        if self.batch_holder is None:
            why = ("the script's batch size is in no `batch_size` attribute or hyperparameter of its "
                   "LightningDataModule or LightningModule, where autotune (like Lightning's batch-size "
                   "finder) sets it: add one (self.batch_size = 32, read by train_dataloader()) to let "
                   "autotune search the batch")
            out["batch_size"] = why
            out["grad_accum"] = "kept as the script has it, with its batch (see batch_size)"
        if not self.a_loader:
            why = (f"the script trains on a {self.loader_kind}, not a torch DataLoader: its workers, "
                   "pinning and prefetch are its own")
            for knob in ("num_workers", "persistent_workers", "prefetch_factor", "pin_memory"):
                out[knob] = why
        if self.precision is None:
            out["precision"] = (f"the script's Trainer has precision={self.trainer_values.get('precision')!r}, "
                                "which autotune keeps")
        if self.compiled:
            out["compile"] = "the script compiles its LightningModule itself"
        return out

    def baseline(self, cfg: TrialConfig) -> TrialConfig:
        """``cfg`` (the space's baseline) as the script sets its knobs."""
        v = self.loader_values
        found = v.get("num_workers")
        workers = found if isinstance(found, int) and self.a_loader else 0
        prefetch = v.get("prefetch_factor")
        benchmark = bool(self.trainer_values.get("benchmark")) and cfg.device == Device.CUDA
        return cfg.replace(batch_size=self.per_device * self.accumulation, grad_accum=self.accumulation,
                           num_workers=workers, precision=self.precision or Precision.FP32,
                           compile=CompileMode.DEFAULT if self.compiled else CompileMode.OFF,
                           persistent_workers=bool(v.get("persistent_workers")) and workers > 0,
                           prefetch_factor=prefetch if workers and isinstance(prefetch, int) else None,
                           pin_memory=bool(v.get("pin_memory")) and cfg.device == Device.CUDA,
                           cudnn_benchmark=benchmark)

    def overrides(self, cfg: TrialConfig) -> JsonObject:
        """What makes the script train ``cfg``: the Trainer's and the DataLoader's keyword
        arguments, the batch size and the compile that differ from what the script has (none
        for its baseline)."""
        base = self.baseline(cfg)
        trainer: JsonObject = {}
        if self.precision is not None and TRAINER_PRECISION[cfg.precision] != TRAINER_PRECISION[base.precision]:
            trainer["precision"] = TRAINER_PRECISION[cfg.precision]
        if cfg.grad_accum != self.accumulation:
            trainer["accumulate_grad_batches"] = cfg.grad_accum
        if cfg.device == Device.CUDA and cfg.cudnn_benchmark != base.cudnn_benchmark:
            trainer["benchmark"] = cfg.cudnn_benchmark
        if cfg.nprocs > 1:
            # its ranks are started as torchrun starts them (RANK, LOCAL_RANK, WORLD_SIZE): Lightning's
            # DDP joins them rather than launching processes of its own
            if self.trainer_values.get("devices") != cfg.nprocs:
                trainer["devices"] = cfg.nprocs
            if self.trainer_values.get("strategy") not in ("ddp", "DDPStrategy"):
                trainer["strategy"] = "ddp"
        elif self.trainer_values.get("devices") not in (None, 1, "1"):
            # one process, as measured: Lightning's own launcher would start the others without the tuning
            trainer["devices"] = 1
        loader: JsonObject = {}
        if self.a_loader:
            want: dict[str, JsonValue] = {"num_workers": cfg.num_workers,
                                          "persistent_workers": cfg.persistent_workers and cfg.num_workers > 0}
            if cfg.num_workers and cfg.prefetch_factor:
                want["prefetch_factor"] = cfg.prefetch_factor
            if cfg.device == Device.CUDA:
                want["pin_memory"] = cfg.pin_memory
            loader = {k: v for k, v in want.items() if self.loader_values.get(k) != v
                      and not (k == "persistent_workers" and not v and not self.loader_values.get(k))}
        out: JsonObject = {}
        if trainer:
            out["trainer"] = trainer
        if loader:
            out["loader"] = loader
        if self.batch_holder is not None and cfg.micro_batch != self.per_device:
            out["batch_size"] = cfg.micro_batch
        if cfg.compile != base.compile and cfg.compile != CompileMode.OFF:
            out["compile"] = cfg.compile.value
        if cfg.device == Device.CUDA and cfg.precision == Precision.TF32:
            out["matmul_precision"] = "high"
        return out

    def trial(self, overrides: JsonObject, *, scored: bool = False) -> tuple[tuple[str, ...], JsonObject]:
        """What a trial runs for ``overrides``: the script's arguments, and its Trainer's and
        DataLoader's arguments, batch size and compile as ``runtime.lightning_script`` sets them."""
        return self.argv, overrides

    def emitted(self, overrides: JsonObject, *, script: Path) -> dict[str, str]:
        return {}  # the answer is arguments: run_tuned.json and tuned_arguments.md say them

    def instructions(self, overrides: JsonObject, *, script: Path) -> list[str]:
        """tuned_arguments.md's lines: the changes to make in the script."""
        return ["Change these in your script:", ""] + [f"- {line}" for line in self.said(overrides)]

    def flags(self, overrides: JsonObject) -> list[str]:
        return []  # a Lightning script's arguments are in its code

    def argv_with(self, overrides: JsonObject) -> list[str]:
        return list(self.argv)

    def said(self, overrides: JsonObject) -> list[str]:
        """``overrides`` as the lines of the script they change."""
        out = []
        trainer = overrides.get("trainer")
        if isinstance(trainer, dict) and trainer:
            at = f" (line {self.trainer_line})" if self.trainer_line else ""
            out.append(f"Trainer{at}: " + ", ".join(f"{k}={v!r}" for k, v in trainer.items()))
        loader = overrides.get("loader")
        if isinstance(loader, dict) and loader:
            at = f" (line {self.loader_line})" if self.loader_line else ""
            out.append(f"training DataLoader{at}: " + ", ".join(f"{k}={v!r}" for k, v in loader.items()))
        if "batch_size" in overrides:
            out.append(f"{self.batch_holder} = {overrides['batch_size']}")
        if "compile" in overrides:
            mode = overrides["compile"]
            at = f" (line {self.fit_line})" if self.fit_line else ""
            out.append(f"trainer.fit(torch.compile(model{'' if mode == 'default' else f', mode={mode!r}'}), ...){at}, "
                       "after model.log = torch.compiler.disable(model.log) (dynamo cannot trace Lightning's log)")
        if "matmul_precision" in overrides:
            out.append(f"torch.set_float32_matmul_precision({overrides['matmul_precision']!r}) before fit")
        return out


def imports(tree: ast.AST) -> str | None:
    """The Lightning package the source imports (``lightning`` or ``pytorch_lightning``), if any."""
    for n in ast.walk(tree):
        names = ([a.name for a in n.names] if isinstance(n, ast.Import)
                 else [n.module or ""] if isinstance(n, ast.ImportFrom) else [])
        for name in names:
            if name.split(".")[0] in PACKAGES:
                return name.split(".")[0]
    return None


def fit_calls(tree: ast.AST) -> list[ast.Call]:
    """The ``X.fit(...)`` calls of the source."""
    return [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == "fit"]


def loader_line(tree: ast.AST) -> int | None:
    """The line that builds the training DataLoader: the ``DataLoader(...)`` inside a
    ``train_dataloader`` method, else the first one in the file."""
    def loaders(node: ast.AST) -> list[int]:
        return sorted(n.lineno for n in ast.walk(node) if isinstance(n, ast.Call) and (
            (isinstance(n.func, ast.Name) and n.func.id == "DataLoader")
            or (isinstance(n.func, ast.Attribute) and n.func.attr == "DataLoader")))

    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "train_dataloader" and loaders(node):
            return loaders(node)[0]
    found = loaders(tree)
    return found[0] if found else None


def check_fits_once(shown: str, source: str, line: int | None) -> None:
    """A script whose training autotune measures calls ``fit`` once."""
    tree = ast.parse(source)
    lines = sorted({c.lineno for c in fit_calls(tree)})
    if len(lines) > 1:
        raise ContractError(
            f"{shown}:{lines[1]}: the script calls fit() more than once (lines {', '.join(map(str, lines))}). "
            "autotune tunes one training: keep one trainer.fit() call (put the others behind a command-line "
            "flag), then run autotune again.")
    if line is not None and in_loop(tree, line):
        raise ContractError(f"{shown}:{line}: fit() is called inside a loop, so the script trains more than once. "
                            "autotune tunes one training: call trainer.fit() once, then run autotune again.")


# --- the check, in its child process

def _explain(shown: str, path: str, exc: BaseException, built: object) -> str:
    from autotune.runtime.stepper import ScriptEnded

    if isinstance(exc, ContractError):
        return str(exc)
    if isinstance(exc, ScriptEnded):
        return (f"{shown}: {exc}. autotune measures the training the script starts: make sure running "
                "`python SCRIPT [ARGS]` reaches trainer.fit() (arguments for the script go after `--`: "
                "autotune run SCRIPT -- ARGS).")
    accelerator = getattr(built, "trainer_values", {}).get("accelerator")
    if accelerator not in (None, "auto", "cpu") and type(exc).__name__ == "MisconfigurationException":
        return (f"{shown}: the script's Trainer asks for accelerator={accelerator!r}, which this machine does not "
                f"have ({exc}). Let the Trainer choose (accelerator=\"auto\"), or run autotune where that "
                "accelerator is, then run autotune again.")
    return (f"{shown}: the script raised an error before its Trainer's first steps:\n"
            f"{_user_frames(''.join(traceback.format_exception(exc)), path)}")


def _check(path: str, argv: Sequence[str], out_dir: str) -> tuple[LightningFacts, float]:
    from autotune.runtime.lightning_script import LightningStepper

    shown = os.path.relpath(path)
    source = Path(path).read_text()
    tree = ast.parse(source)
    stepper = LightningStepper(path, argv, {}, source_module=imports(tree) or "lightning", out_dir=out_dir)
    built = stepper.built
    try:
        stepper.start()
    except BaseException as exc:
        raise ContractError(_explain(shown, path, exc, built)) from None
    fit_line = built.fit_lines[0] if built.fit_lines else None
    check_fits_once(shown, source, fit_line)
    try:
        stepper.run_steps(1)
        step_s, _ = stepper.run_steps(1)
    except BaseException as exc:
        raise ContractError(_explain(shown, path, exc, built)) from None
    facts = stepper.facts()
    module = stepper.model
    loader = stepper.trainer.train_dataloader
    try:
        dataset_len: int | None = len(loader.dataset)
    except (TypeError, AttributeError):
        dataset_len = None
    metric, greater = _metric(built, stepper) if built.has_val else ("val_loss", False)
    return LightningFacts(
        argv=tuple(argv), source_module=imports(tree) or "lightning", trainer_line=built.trainer_line,
        fit_line=fit_line, loader_line=loader_line(tree),
        trainer_values=built.trainer_values, loader_values=built.loader_values, loader_kind=built.loader_kind,
        loader_source=built.loader_source, batch_holder=built.batch_holder, compiled=bool(facts["compiled"]),
        has_eval=built.has_val and bool(metric), metric=metric, greater_is_better=greater,
        model_class=type(module).__name__, parameters=sum(p.numel() for p in module.parameters()),
        dataset_len=dataset_len, seed=built.seed,
    ), step_s


def _metric(built: object, stepper: object) -> tuple[str, bool]:
    """The metric the quality gate reads, and whether higher is better: what the script's
    checkpoint or early-stopping callback monitors (its ``mode``), else the first validation
    metric it logs (accuracy-like higher, loss-like lower); "" where it logs none."""
    monitor, mode = getattr(built, "monitor", None), getattr(built, "mode", None)
    logged = stepper.evaluate()  # type: ignore[attr-defined]
    if monitor and monitor in logged:
        return monitor, mode == "max"
    names = [k for k in logged if k.startswith("val")] or list(logged)
    if not names:
        return "", False
    name = names[0]
    return name, not any(word in name.lower() for word in ("loss", "error", "perplexity", "mse", "mae"))


def check_script(path: Path, argv: Sequence[str], *, timeout_s: float) -> tuple[LightningFacts, float]:
    """Run the check of the Lightning script ``path`` with ``argv``; its facts and how long it
    took, or ContractError."""
    from autotune.task.child import check_script_in_child

    data, seconds = check_script_in_child("autotune.task.lightning_script", path, argv, timeout_s=timeout_s,
                                          calls="trainer.fit()", framework="lightning")
    return LightningFacts.from_json(data), seconds


def recognises(tree: ast.Module) -> bool:
    """It imports lightning (or pytorch_lightning) and calls a ``.fit()``."""
    return bool(imports(tree) and fit_calls(tree))


WAY = WayIn(kind=KIND, facts=LightningFacts, recognises=recognises,
            check=lambda path, argv, timeout_s: check_script(path, argv, timeout_s=timeout_s),
            task_fields=lambda facts: {"image_inputs": False,
                                       "optimizer": "the LightningModule's configure_optimizers()"})


if __name__ == "__main__":
    from autotune.task import lightning_script
    from autotune.task.child import script_child_main

    script_child_main(lightning_script._check, sys.argv[1:])
