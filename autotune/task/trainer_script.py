"""The second way in: a Hugging Face Trainer script the user already runs.

A file that builds a ``transformers.Trainer`` and calls ``.train()`` (at import or under
``if __name__ == "__main__":``; its ``TrainingArguments`` in code or parsed by
``HfArgumentParser`` from the arguments after ``--``) is recognised by its source and checked
in a child process (``python -m autotune.task.trainer_script SCRIPT OUT [ARGS]``): the
script runs as its user runs it, with ``runtime.hf_script``'s hooks, up to two steps of its
Trainer, and what it built is written back (``TrainerFacts``). Trials run it the same way with
``overrides`` for their configuration; the baseline is the script as written.
"""
from __future__ import annotations

import ast
import dataclasses
import os
import shlex
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

from autotune.config import TrialConfig
from autotune.errors import ContractError
from autotune.runtime.json_value import JsonObject
from autotune.runtime.knobs import DEFAULT_OPTIMIZER, CompileMode, Device, OptimizerStep, Precision
from autotune.schemas.typed import Record
from autotune.task.way_in import WayIn
from autotune.user_file import _user_frames, in_loop

KIND = "hf_trainer"
# The knobs a Trainer script cannot be told through its TrainingArguments or its process,
# and why: named as skipped by the space.
NOT_EXPRESSIBLE = {
    "channels_last": "a Trainer script: TrainingArguments has no memory-format argument",
    "prune_ratio": "a Trainer script: pruning changes the model the script builds",
    "interop_threads": "a Trainer script: no TrainingArguments field or environment variable sets it",
    "ipex": "a Trainer script: the Trainer's IPEX option ended with intel-extension-for-pytorch 2.8",
    "cudnn_benchmark": "a Trainer script: TrainingArguments has no cuDNN benchmark argument",
    "activation_checkpointing": "a Trainer script: gradient checkpointing is not searched yet",
    "sharding": "a Trainer script: FSDP through the Trainer is not searched yet",
    "grad_accum": "a Trainer script: gradient accumulation is kept as the script has it",
    "ddp_bucket_view": "a Trainer script: TrainingArguments has no gradient_as_bucket_view argument",
}


@dataclasses.dataclass(frozen=True)
class TrainerFacts(Record):
    """A Trainer script as its check saw it: the arguments it was given (``argv``), whether
    ``HfArgumentParser`` built its TrainingArguments from them (``parsed``), the lines that
    built them and called ``train()``, the knob fields as the user wrote them, and what the
    Trainer trains on."""

    argv: tuple[str, ...] = ()
    parsed: bool = False
    args_line: int | None = None
    train_line: int | None = None
    user_values: JsonObject = dataclasses.field(default_factory=dict)
    has_eval: bool = False
    metric: str = "eval_loss"
    greater_is_better: bool = False
    model_class: str = ""
    parameters: int = 0
    dataset_len: int | None = None

    kind = KIND
    source_module = "transformers"
    stack = "TrainingArguments"
    unjudged = ("without an eval_dataset in the script's Trainer", "give its Trainer an eval_dataset")
    length_keys = ("max_steps", "num_train_epochs")
    stepper = "autotune.runtime.hf_script:HfStepper"
    template = "run_tuned.py"
    hooks = ("hf_script.py",)
    no_ranks = None  # its ranks join the Trainer's DDP through the environment torchrun would give it
    # accelerate shards one process's batches (the same seeded shuffle) over the ranks in turn: a
    # step's samples on N ranks of batch b are one process's at batch N*b, so the numerics check compares them
    ranks_reorder = False

    @property
    def scored_by(self) -> str:
        return self.metric

    def describe(self) -> str:
        return (f"a Hugging Face Trainer script ({self.model_class}, TrainingArguments "
                f"{'from its command line' if self.parsed else 'in code'}"
                f"{', with an eval_dataset' if self.has_eval else ''}): trials run it with its TrainingArguments "
                "overridden, measured inside its Trainer")

    def skipped(self) -> dict[str, str]:
        """The knobs this script cannot take, with the reason."""
        out = dict(NOT_EXPRESSIBLE)
        optim = self.user_values.get("optim")
        if optim != "adamw_torch":
            out["optimizer_step"] = f"the script's optim is {optim!r}: only adamw_torch has a fused step to switch to"
        return out

    def said(self, overrides: JsonObject) -> list[str]:
        """``overrides`` as the script takes them: flags, or keyword arguments."""
        if self.parsed:
            return [" ".join(self.flags(overrides))] if overrides else []
        where = f" at line {self.args_line}" if self.args_line else ""
        return ([f"TrainingArguments(..., {', '.join(f'{k}={v!r}' for k, v in overrides.items())}){where}"]
                if overrides else [])

    def number(self, key: str, default: int) -> int:
        value = self.user_values.get(key)
        return int(value) if isinstance(value, (int, float)) and value else default

    @property
    def per_device(self) -> int:
        return self.number("per_device_train_batch_size", 8)

    @property
    def accumulation(self) -> int:
        return self.number("gradient_accumulation_steps", 1)

    def baseline(self, cfg: TrialConfig) -> TrialConfig:
        """``cfg`` (the space's baseline) as the script sets its knobs: its batch, workers,
        precision and compile as written."""
        v = self.user_values
        workers = self.number("dataloader_num_workers", 0)
        precision = (Precision.BF16 if v.get("bf16") else Precision.FP16 if v.get("fp16")
                     else Precision.TF32 if v.get("tf32") and cfg.device == Device.CUDA else Precision.FP32)
        compile_mode = (CompileMode(v.get("torch_compile_mode") or CompileMode.DEFAULT.value)
                        if v.get("torch_compile") else CompileMode.OFF)
        return cfg.replace(batch_size=self.per_device * self.accumulation, grad_accum=self.accumulation,
                           num_workers=workers, precision=precision, compile=compile_mode,
                           persistent_workers=bool(v.get("dataloader_persistent_workers")) and workers > 0,
                           prefetch_factor=self.number("dataloader_prefetch_factor", 0) or None if workers else None,
                           pin_memory=bool(v.get("dataloader_pin_memory")) and cfg.device == Device.CUDA)

    def overrides(self, cfg: TrialConfig) -> JsonObject:
        """The TrainingArguments fields that make the script train ``cfg``: those whose value
        for ``cfg`` differs from what the script has (none for its baseline)."""
        v = self.user_values
        want: JsonObject = {
            "per_device_train_batch_size": cfg.micro_batch,
            "gradient_accumulation_steps": cfg.grad_accum,
            "dataloader_num_workers": cfg.num_workers,
            "dataloader_persistent_workers": cfg.persistent_workers and cfg.num_workers > 0,
            "bf16": cfg.precision == Precision.BF16,
            "fp16": cfg.precision == Precision.FP16,
            "torch_compile": cfg.compile != CompileMode.OFF,
        }
        if cfg.num_workers and cfg.prefetch_factor:  # TrainingArguments refuses it without workers
            want["dataloader_prefetch_factor"] = cfg.prefetch_factor
        if cfg.device == Device.CUDA:
            want["dataloader_pin_memory"] = cfg.pin_memory
            want["tf32"] = cfg.precision == Precision.TF32
        if cfg.compile != CompileMode.OFF:
            want["torch_compile_mode"] = None if cfg.compile == CompileMode.DEFAULT else cfg.compile.value
        if cfg.optimizer_step == OptimizerStep.FUSED:
            want["optim"] = "adamw_torch_fused"
        if cfg.device == Device.CPU and cfg.precision == Precision.BF16:
            want["use_cpu"] = True  # TrainingArguments takes bf16 on a CPU only so
        if cfg.nprocs > 1:  # the backend the ranks' process group was started with (gloo, nccl)
            want["ddp_backend"] = cfg.backend.value
            if cfg.device == Device.CPU:
                want["use_cpu"] = True  # accelerate runs CPU ranks as one process without it
            if cfg.ddp_static_graph:
                want["ddp_static_graph"] = True
        out: JsonObject = {}
        for key, value in want.items():
            mine = v.get(key)
            if key == "tf32" and mine is None and value is False:
                continue  # torch's own default, as the script has it
            if key == "torch_compile_mode" and cfg.compile == CompileMode.OFF:
                continue
            if mine != value:
                out[key] = value
        return out

    def trial(self, overrides: JsonObject, *, scored: bool = False) -> tuple[tuple[str, ...], JsonObject]:
        """What a trial runs for ``overrides``: the script's arguments, and the fields its
        TrainingArguments are given (set before they are checked, as if written there)."""
        return self.argv, overrides

    def emitted(self, overrides: JsonObject, *, script: Path) -> dict[str, str]:
        return {}  # the answer is arguments: run_tuned.json and tuned_arguments.md say them

    def instructions(self, overrides: JsonObject, *, script: Path) -> list[str]:
        """tuned_arguments.md's lines: the flags to add, or the keyword arguments to set."""
        if self.parsed:
            command = shlex.join(["python", script.name, *self.argv_with(overrides)])
            return ["Your script parses its TrainingArguments: add these flags to its command line.", "",
                    "    " + shlex.join(self.flags(overrides)), "", "The whole command:", "", "    " + command]
        where = f" (line {self.args_line})" if self.args_line else ""
        return ([f"Your script builds its TrainingArguments in code{where}: set these keyword arguments there.", ""]
                + [f"    {key}={value!r}," for key, value in overrides.items()])

    def flags(self, overrides: JsonObject) -> list[str]:
        """``overrides`` as HfArgumentParser takes them on the command line."""
        out: list[str] = []
        for key, value in overrides.items():
            out += [f"--{key}", "None" if value is None else str(value)]
        return out

    def argv_with(self, overrides: JsonObject) -> list[str]:
        """The script's arguments with ``overrides`` in place of the same flags where it has
        them (``--key value``, ``--key=value`` or a bare ``--flag``), added after them where not."""
        rest = dict(overrides)
        out: list[str] = []
        argv = list(self.argv)
        i = 0
        while i < len(argv):
            token = argv[i]
            key = token[2:].split("=", 1)[0] if token.startswith("--") else None
            if key is None or key not in rest:
                out.append(token)
                i += 1
                continue
            out += self.flags({key: rest.pop(key)})
            has_value = "=" not in token and i + 1 < len(argv) and not argv[i + 1].startswith("--")
            i += 2 if has_value else 1
        return out + self.flags(rest)


def train_calls(tree: ast.AST) -> list[ast.Call]:
    """The ``X.train(...)`` calls of the source whose receiver is not a model (``model.train()``
    switches a module to training mode)."""
    calls = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "train"
                and not (isinstance(node.func.value, ast.Name) and "model" in node.func.value.id.lower())):
            calls.append(node)
    return calls


def check_trains_once(shown: str, source: str, line: int | None) -> None:
    """A script whose training autotune measures calls ``train()`` once: a second call
    trains something else (the baseline would be ambiguous)."""
    tree = ast.parse(source)
    lines = sorted({c.lineno for c in train_calls(tree)})
    if len(lines) > 1:
        raise ContractError(
            f"{shown}:{lines[1]}: the script calls train() more than once (lines {', '.join(map(str, lines))}). "
            "autotune tunes one training: keep one trainer.train() call (put the others behind a "
            "command-line flag), then run autotune again.")
    if line is not None and in_loop(tree, line):
        raise ContractError(
            f"{shown}:{line}: train() is called inside a loop, so the script trains more than once. "
            "autotune tunes one training: call trainer.train() once, then run autotune again.")


# --- the check, in its child process

def _hub_name(exc: BaseException) -> str | None:
    """The Hub model or data set a failed load asked for, where one did."""
    tb = exc.__traceback__
    name = None
    while tb is not None:
        local = tb.tb_frame.f_locals
        for key in ("pretrained_model_name_or_path", "repo_id", "path"):
            value = local.get(key)
            if isinstance(value, str) and value and not os.path.exists(value):
                name = name or value
        tb = tb.tb_next
    return name


def _offline_failure(exc: BaseException) -> bool:
    text = f"{type(exc).__module__}.{type(exc).__name__}: {exc}".lower()
    return ("huggingface_hub" in text or "offline" in text or "couldn't connect" in text
            or "local_files_only" in text or "hf.co" in text or "huggingface.co" in text)


def _explain(shown: str, path: str, exc: BaseException) -> str:
    if isinstance(exc, ContractError):
        return str(exc)
    from autotune.runtime.stepper import ScriptEnded

    parser_error = _parser_refusal(exc)
    if parser_error is not None:
        return (f"{shown}: the script's argument parser refused the arguments after `--`: {parser_error}. "
                "Give the arguments the script takes (run `python SCRIPT --help`).")
    if isinstance(exc, ScriptEnded):
        return (f"{shown}: {exc}. autotune measures the training the script starts: make sure "
                "running `python SCRIPT [ARGS]` reaches trainer.train() (arguments for the script go after "
                "`--`: autotune run SCRIPT -- ARGS).")
    if isinstance(exc, OSError) and _offline_failure(exc):
        name = _hub_name(exc)
        what = f"'{name}'" if name else "a model or data set"
        return (f"{shown}: the script loads {what} from the Hugging Face Hub, and it is not on this machine "
                "(autotune's check and trials download nothing). Download it once "
                f"(`hf download {name or 'NAME'}`), or point the script at a local folder, then run "
                f"autotune again.\n{_user_frames(''.join(traceback.format_exception(exc)), path)}")
    return (f"{shown}: the script raised an error before its Trainer's first steps:\n"
            f"{_user_frames(''.join(traceback.format_exception(exc)), path)}")


def _parser_refusal(exc: BaseException) -> str | None:
    """What HfArgumentParser (argparse) said when it refused the command line: it prints
    its message and exits with 2."""
    from autotune.runtime.stepper import ScriptEnded

    if isinstance(exc, ScriptEnded) and exc.code == 2:
        return "see its message above"
    if isinstance(exc, ValueError) and "Some specified arguments are not used by the HfArgumentParser" in str(exc):
        return str(exc)
    return None


def _check(path: str, argv: Sequence[str], out_dir: str) -> tuple[TrainerFacts, float]:
    from autotune.runtime import hf_script
    from autotune.runtime.hf_script import HfStepper

    shown = os.path.relpath(path)
    source = Path(path).read_text()
    stepper = HfStepper(path, argv, {**hf_script.QUIET, "output_dir": out_dir,
                                            "max_steps": hf_script.ENDLESS_STEPS})
    try:
        stepper.start()
    except BaseException as exc:
        raise ContractError(_explain(shown, path, exc)) from None
    built = stepper.built
    train_line = built.train_lines[0] if built.train_lines else None
    check_trains_once(shown, source, train_line)
    try:
        stepper.run_steps(1)
        step_s, _ = stepper.run_steps(1)
    except BaseException as exc:
        raise ContractError(_explain(shown, path, exc)) from None
    trainer = stepper.trainer
    dataset = trainer.train_dataset
    try:
        dataset_len: int | None = len(dataset)
    except TypeError:
        dataset_len = None
    args = trainer.args
    metric = args.metric_for_best_model or "eval_loss"
    if not metric.startswith("eval_"):
        metric = f"eval_{metric}"
    greater = args.greater_is_better
    if greater is None:
        greater = not metric.endswith("loss")
    model = trainer.model
    return TrainerFacts(
        argv=tuple(argv), parsed=built.parsed, args_line=built.args_line, train_line=train_line,
        user_values=built.user_values, has_eval=trainer.eval_dataset is not None, metric=metric,
        greater_is_better=bool(greater), model_class=type(model).__name__,
        parameters=sum(p.numel() for p in model.parameters()), dataset_len=dataset_len,
    ), step_s


def check_script(path: Path, argv: Sequence[str], *, timeout_s: float) -> tuple[TrainerFacts, float]:
    """Run the check of the Trainer script ``path`` with ``argv``; its facts and how long it
    took, or ContractError."""
    from autotune.task.child import check_script_in_child, explain_parser

    data, seconds = check_script_in_child("autotune.task.trainer_script", path, argv, timeout_s=timeout_s,
                                          calls="trainer.train()", framework="transformers",
                                          explain=explain_parser)
    return TrainerFacts.from_json(data), seconds


def _task_fields(facts: TrainerFacts) -> dict[str, object]:
    optim = facts.user_values.get("optim")
    return {"image_inputs": False,
            "optimizer": DEFAULT_OPTIMIZER if optim == "adamw_torch" else f"the Trainer's optim={optim}"}


def recognises(tree: ast.Module) -> bool:
    """It imports transformers and calls a ``.train()`` that is not a model's."""
    return any((isinstance(n, ast.Import) and any(a.name.split(".")[0] == "transformers" for a in n.names))
               or (isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] == "transformers")
               for n in ast.walk(tree)) and bool(train_calls(tree))


WAY = WayIn(kind=KIND, facts=TrainerFacts, recognises=recognises,
            check=lambda path, argv, timeout_s: check_script(path, argv, timeout_s=timeout_s),
            task_fields=_task_fields)


if __name__ == "__main__":
    # through the module's own name: its types are the ones the tuner reads back
    from autotune.task import trainer_script
    from autotune.task.child import script_child_main

    script_child_main(trainer_script._check, sys.argv[1:])
