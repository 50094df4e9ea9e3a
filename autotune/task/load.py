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
from autotune.task.check_result import CheckResult
from autotune.task.child import run_check
from autotune.task.way_in import PrintedMetric, ScriptFacts, WayIn
from autotune.task.ways import ways
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
    script: ScriptFacts | None = None

    @property
    def unjudged(self) -> tuple[str, str]:
        """Why nothing judges a larger batch's quality where nothing does, and what would: words
        for the messages that keep the batch within eight times the user's."""
        if self.script is not None:
            return self.script.unjudged
        return "without evaluate(model) in the model file", "give the model file an evaluate()"

    @property
    def scored_by(self) -> str:
        """What scores the quality gates' trainings, for the verdicts' words."""
        return self.script.scored_by if self.script is not None else "evaluate()"

    @property
    def ranks_reorder(self) -> bool:
        """Whether its ranks train on another order of its data than one process does (a
        Lightning script's DistributedSampler): the quality check, not the numerics check,
        judges its layouts."""
        return self.script is not None and self.script.ranks_reorder

    @property
    def greater_is_better(self) -> bool:
        """The sense of what scores it (evaluate() is higher-is-better)."""
        return self.script.greater_is_better if self.script is not None else True

    @property
    def kind(self) -> str:
        """Which way in: "model_file", or the script's kind."""
        return self.script.kind if self.script is not None else "model_file"


def load_task(path: str | os.PathLike[str], *, timeout_s: float = CHECK_TIMEOUT_S,
              device: str | None = None, script_args: tuple[str, ...] = (),
              metric: PrintedMetric | None = None) -> Task:
    """Check the model file, or the script (a way in, ``way_in.ways``) run with ``script_args``,
    and describe it, or raise ContractError. ``device`` is where the check puts a model file's
    model; None: where the trials would (see check_device). ``metric``: the metric a plain
    loop prints (``--metric``), which judges its quality."""
    path = Path(path)
    way = _check_source(path)
    if metric is not None and (way is None or way.with_metric is None):
        what = "a model file, whose quality is its evaluate(model)" if way is None else (
            f"a {way.kind} script, whose quality is its Trainer's own evaluation")
        raise ContractError(f"{path}: --metric reads the metric a plain training loop prints, and this is {what}: "
                            "drop --metric.")
    if way is not None:
        facts, check_s = way.check(path, script_args, timeout_s)
        if metric is not None and way.with_metric is not None:
            facts = way.with_metric(facts, metric)
        return Task(path=path.resolve(), batch_size=facts.per_device * facts.accumulation,
                    dataset_len=facts.dataset_len, has_evaluate=facts.has_eval, parameters=facts.parameters,
                    has_training_step=True, check_s=check_s, script=facts, **way.task_fields(facts))
    if script_args:
        raise ContractError(f"{path}: arguments after `--` go to a script you run (a training loop, a Trainer or a "
                            "Lightning script), and this is a model file: drop them (a model file takes its settings "
                            "in code).")
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


# Names only a model file defines: a file with any of them is checked as one (and its
# check names what is missing), unless it builds a Trainer.
MODEL_FILE_NAMES = {"build_model", "build_dataset", "build_optimizer", "loss_fn", "training_step",
                    "collate_fn", "evaluate", "batch_size"}
MODEL_FILE = "model_file"
# Of those, the ones no training script defines: with one, a file that trains is a model file
# half written (its check says what it lacks), not a plain loop (which may well define evaluate()).
CONTRACT_BUILDERS = {"build_model", "build_dataset", "build_optimizer"}


def recognise(path: Path, source: str) -> str | None:
    """The kind of file ``source`` is: a model file (it defines ``build_model``, or other names
    of the contract and builds no Trainer), a script of a way in (``way_in.ways``: a Lightning
    script, a Trainer script, a plain loop), or None."""
    way = _way(source)
    if way is not None:
        return way.kind
    return MODEL_FILE if _model_names(source) else None


def _model_names(source: str) -> set[str]:
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    names |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    names |= {a.asname or a.name for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    return names & MODEL_FILE_NAMES


def _way(source: str) -> WayIn | None:
    """The way in whose script ``source`` is; None for a model file or an unknown file. A file
    that defines ``build_model`` is a model file; one that builds a Trainer is that Trainer's;
    a file with other names of the contract is a model file before it is a plain loop."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    names = _model_names(source)
    if "build_model" in names:
        return None
    for way in ways():
        if way.recognises(tree) and not (names & CONTRACT_BUILDERS and way.after_model_file):
            return way
    return None


def _check_source(path: Path) -> WayIn | None:
    """What can be checked without running the file: it exists, reads and compiles, and
    which way in it is (a script's; None: a model file)."""
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
    way = _way(source)
    if way is None and not _model_names(source):
        raise ContractError(
            f"{path}: not a file autotune takes. It takes a training script you run: a plain PyTorch loop (one "
            "that imports torch, builds a torch.optim optimizer and calls loss.backward() and optimizer.step()), a "
            "Hugging Face Trainer script (one that builds a Trainer and calls trainer.train()) or a Lightning "
            "script (one that builds a Trainer and calls trainer.fit()); or a model file (one that defines "
            "build_model() and build_dataset(); `autotune init` writes one to fill in).")
    return way


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
