"""The user's model file: loading it and checking the contract.

The file is checked before any trial starts. Importing it runs the user's code, so
that happens in a child process (``python -m autotune.task.check FILE OUT``): a file
that crashes, hangs or exits cannot take the tuner with it. Every violation becomes one
ContractError naming the file, the function and the fix.

The check's step and evaluate() run with the model where the trials put it: cuda:0 when
the checking process sees a GPU (check.check_device). evaluate(model) gets the model
on its training device, so a file whose evaluate() builds its inputs on the CPU fails
here, named, and not at the end of the first epoch of a GPU run.
"""
from __future__ import annotations

import ast
import dataclasses
import os
import time
from pathlib import Path

from autotune.errors import ContractError
from autotune.runtime.knobs import DEFAULT_OPTIMIZER
from autotune.task import lightning_script, trainer_script
from autotune.task.check_result import CheckResult
from autotune.task.child import run_check
from autotune.task.lightning_script import LightningFacts
from autotune.task.trainer_script import KIND as TRAINER_SCRIPT
from autotune.task.trainer_script import ScriptFacts, check_script
from autotune.trials.proctree import with_package_on_path

CHECK_TIMEOUT_S = 300


@dataclasses.dataclass(frozen=True)
class Task:
    """What the tuner knows about a valid model file."""

    path: Path
    batch_size: int
    # Items per epoch; None for an IterableDataset without a length whose stream runs past
    # dataset.STREAM_LOOKAHEAD_BATCHES batches (endless, or too long to count in the check).
    dataset_len: int | None
    image_inputs: bool  # 4-D float inputs: channels_last can apply
    has_evaluate: bool
    parameters: int
    # Names of BatchNorm layers: several ranks would each normalize over their own share
    # of the batch, so a multi-rank layout trains a different model (see space.py).
    batchnorm_layers: tuple[str, ...] = ()
    # Class names of the model's repeated blocks (autotune.runtime.memory_knobs.repeated_blocks):
    # what activation checkpointing and sharding act on; none, and those knobs cannot apply.
    blocks: tuple[str, ...] = ()
    # The file calls the model its own way (training_step): the tuner cannot call it on a
    # batch's inputs, which tracing the model for pruning needs.
    has_training_step: bool = False
    # The optimizer's class as build_optimizer(params) builds it (module.qualname; torch's
    # AdamW, the runtime's own, without one): whether its step can be fused
    # (autotune.space.conditional), known here without building it again.
    optimizer: str = DEFAULT_OPTIMIZER
    # Whether the model has convolution layers: cuDNN's benchmark picks their algorithms,
    # and does nothing for a model without them (True where not known).
    convolutions: bool = True
    check_s: float = 0.0  # how long the check took: import, build_dataset, build_model, a step
    # The seconds one evaluate(model) call took in the check (0: none, or a script's, untimed): each
    # scored training of verification calls it several times, counted in --timeout and its limits.
    evaluate_s: float = 0.0
    # A script the user runs (a Hugging Face Trainer script, a Lightning script) rather than a
    # model file: what its check saw (its arguments, its Trainer's as written); path is the script.
    script: ScriptFacts | LightningFacts | None = None

    @property
    def kind(self) -> str:
        """Which way in: "model_file", or the script's kind."""
        return self.script.kind if self.script is not None else "model_file"


def load_task(path: str | os.PathLike[str], *, timeout_s: float = CHECK_TIMEOUT_S,
              device: str | None = None, script_args: tuple[str, ...] = ()) -> Task:
    """Check the model file, or the Trainer script run with ``script_args``, and describe it,
    or raise ContractError. ``device`` is where the check puts a model file's model; None:
    where the trials would (see check_device)."""
    path = Path(path)
    kind = _check_source(path)
    if kind == TRAINER_SCRIPT:
        facts, check_s = check_script(path, script_args, timeout_s=timeout_s)
        return Task(path=path.resolve(), batch_size=facts.per_device * facts.accumulation,
                    dataset_len=facts.dataset_len, image_inputs=False, has_evaluate=facts.has_eval,
                    parameters=facts.parameters, has_training_step=True, check_s=check_s, script=facts,
                    optimizer=DEFAULT_OPTIMIZER if facts.user_values.get("optim") == "adamw_torch"
                    else f"the Trainer's optim={facts.user_values.get('optim')}")
    if kind == lightning_script.KIND:
        found, check_s = lightning_script.check_script(path, script_args, timeout_s=timeout_s)
        return Task(path=path.resolve(), batch_size=found.per_device * found.accumulation,
                    dataset_len=found.dataset_len, image_inputs=False, has_evaluate=found.has_eval,
                    parameters=found.parameters, has_training_step=True, check_s=check_s, script=found,
                    optimizer="the LightningModule's configure_optimizers()")
    if script_args:
        raise ContractError(f"{path}: arguments after `--` go to a Trainer or Lightning script, and this is a "
                            "model file: drop them (a model file takes its settings in code).")
    started = time.monotonic()
    result = _run_check(path, timeout_s, device)
    if result.checked is None:
        raise ContractError(result.error or f"{path}: the check gave no reason")
    checked = result.checked
    return Task(path=path.resolve(), batch_size=checked.batch_size, dataset_len=checked.dataset_len,
                image_inputs=checked.image_inputs, has_evaluate=checked.has_evaluate,
                parameters=checked.parameters, batchnorm_layers=checked.batchnorm_layers,
                blocks=checked.blocks, has_training_step=checked.has_training_step,
                optimizer=checked.optimizer, convolutions=checked.convolutions,
                check_s=time.monotonic() - started, evaluate_s=checked.evaluate_s)


def recognise(path: Path, source: str) -> str | None:
    """The kind of file ``source`` is: a model file (it defines ``build_model``, or other names
    of the contract), a Trainer script (it imports transformers and calls a ``.train()``), a
    Lightning script (it imports lightning or pytorch_lightning and calls a ``.fit()``), or
    None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    names |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    names |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    if "build_model" in names:
        return "model_file"
    imports_transformers = any(
        (isinstance(n, ast.Import) and any(a.name.split(".")[0] == "transformers" for a in n.names))
        or (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "transformers")
        for n in ast.walk(tree))
    if lightning_script.imports(tree) and lightning_script.fit_calls(tree):
        return lightning_script.KIND
    if imports_transformers and trainer_script.train_calls(tree):
        return TRAINER_SCRIPT
    if names & trainer_script.MODEL_FILE_NAMES:
        return "model_file"
    return None


def _check_source(path: Path) -> str:
    """What can be checked without running the file: it exists, reads and compiles, and
    which way in it is (``recognise``)."""
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
    kind = recognise(path, source)
    if kind is None:
        raise ContractError(
            f"{path}: not a file autotune takes. It takes a model file (one that defines build_model() and "
            "build_dataset(); `autotune init` writes one to fill in) or a Hugging Face Trainer script (one "
            "that imports transformers, builds a Trainer and calls trainer.train()) or a Lightning script (one that "
            "imports lightning, builds a Trainer and calls trainer.fit()).")
    return kind


def _run_check(path: Path, timeout_s: float, device: str | None = None) -> CheckResult:
    """Run the check in a child process; returns what it wrote. Raises ContractError if
    it times out or dies without writing."""
    data, _ = run_check(
        "autotune.task.check", [str(path.resolve()), *([device] if device else [])],
        env=with_package_on_path(os.environ), timeout_s=timeout_s,
        late=(f"{path}: checking the file took over {timeout_s:.0f} s (importing it, building "
              "the model and dataset, one training step). Make build_model/build_dataset quick."),
        abrupt=f"{path}: the process checking the file ended abruptly while importing or calling it")
    return CheckResult.from_json(data)
