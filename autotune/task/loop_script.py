"""The fourth way in: a plain PyTorch training loop the user already runs.

A file that imports torch, builds a ``torch.optim`` optimizer, calls ``backward`` and the
optimizer's ``step``, and builds no Trainer, is recognised by its source and checked in a
child process (``python -m autotune.task.loop_script SCRIPT OUT [ARGS]``): the script runs as
its user runs it, with ``runtime.loop_script``'s hooks, up to three steps of its optimizer, and
what it built is written back (``LoopFacts``). Trials run it the same way with its source
patched and its arguments changed as the configuration says; the answer is the same, as flags
for its parser and a patch of the script (``runtime.loop_patch``).
"""
from __future__ import annotations

import ast
import dataclasses
import os
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

from autotune.config import TrialConfig
from autotune.errors import ContractError
from autotune.runtime.json_value import JsonObject, JsonValue
from autotune.runtime.knobs import CompileMode, Device, Precision
from autotune.schemas.typed import Record
from autotune.task.loop_source import ddp_line, imports, imports_torch_name
from autotune.task.way_in import WayIn
from autotune.user_file import own_frames

KIND = "loop"
PATCH_NAME = "tuned.patch"
# The knobs a plain loop is not searched on, and why: named as skipped by the space.
NOT_EXPRESSIBLE = {
    "channels_last": "a plain loop: its inputs' memory format is set by its own code (not searched yet)",
    "prune_ratio": "a plain loop: pruning changes the model the script builds",
    "interop_threads": "a plain loop: no environment variable sets it, and the patch keeps to the training",
    "ipex": "a plain loop: IPEX ended with intel-extension-for-pytorch 2.8",
    "cudnn_benchmark": "a plain loop: not searched yet",
    "activation_checkpointing": "a plain loop: its model would checkpoint its own blocks",
    "sharding": "a plain loop: FSDP needs the script's own process group",
    "grad_accum": "a plain loop: gradient accumulation is kept as the script has it",
    "optimizer_step": "a plain loop: the optimizer is built as the script builds it",
}
LOADER_KNOBS = ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor")
DTYPES = {Precision.BF16: "bfloat16", Precision.FP16: "float16"}
NOTE = "  # autotune: verified faster on the machine it was tuned on"
# A measurement's (and the numerics check's) run of a loop bounded by epochs: so many times its
# epochs, ended by the trial once measured
MEASURED_EPOCHS = 100


@dataclasses.dataclass(frozen=True)
class LoopFacts(Record):
    """A plain loop as its check saw it: the arguments it was given, the line that built its
    optimizer and the name of the module that optimizer trains, the line that built the
    DataLoader it draws from (and that loader's arguments), its parser's batch-size flag, and
    what a step takes (``batch``: the samples that entered the module between two steps)."""

    argv: tuple[str, ...] = ()
    optimizer_line: int | None = None
    optimizer_class: str = ""
    module_name: str | None = None
    loader_line: int | None = None
    loader_values: JsonObject = dataclasses.field(default_factory=dict)
    batch_flag: str | None = None
    flag_value: int | None = None
    batch: int = 1
    imports_torch: bool = True
    image_inputs: bool = False
    model_class: str = ""
    parameters: int = 0
    dataset_len: int | None = None
    device: str = "cpu"
    # what judges its quality: the metric it prints (``--metric``), and which way is better
    metric: str = ""
    greater_is_better: bool = True
    length: JsonObject = dataclasses.field(default_factory=dict)  # max_steps or epochs, from its parser
    # where it is written for DDP (calls init_process_group or reads LOCAL_RANK): its ranks are searched
    ddp_line: int | None = None

    kind = KIND
    source_module = "torch"
    stack = "batch flag and training code"
    # without --metric nothing judges its quality
    unjudged = ("in a plain loop without --metric",
                r"name the metric your script prints: --metric 'val_acc (\S+)'")
    length_keys = ("max_steps", "epochs")
    stepper = "autotune.runtime.loop_script:LoopStepper"
    template = "run_tuned_loop.py"
    hooks = ("loop_script.py", "loop_patch.py")
    parsed = True  # its arguments are its command line's
    # a loop written for DDP shards its data with its own sampler (or code): not one process's order
    ranks_reorder = True

    @property
    def no_ranks(self) -> str | None:
        """Why its ranks are not searched; None where they are: it is written for DDP (its
        process group, its sampler), and its batch is set where each rank's can be."""
        if self.ddp_line is None:
            return ("a plain loop not written for DDP (it neither calls init_process_group nor reads LOCAL_RANK): "
                    "each of its ranks would train on all of the data alone; threads are searched")
        if self.batch_flag is None and self.loader_line is None:
            return ("a plain loop whose batch is set in its own code: its ranks' batch could not be set to their "
                    "share of the global batch; threads are searched")
        return None

    def describe(self) -> str:
        where = f"DataLoader at line {self.loader_line}" if self.loader_line else "no DataLoader"
        return (f"a plain training loop ({self.model_class} trained by {self.optimizer_class} at line "
                f"{self.optimizer_line}, {where}, batch {self.batch}"
                f"{f' from {self.batch_flag}' if self.batch_flag else ''}"
                f"{f', written for DDP (line {self.ddp_line})' if self.ddp_line else ''}): trials run it patched, "
                "measured at its optimizer's steps")

    @property
    def has_eval(self) -> bool:
        return bool(self.metric)

    @property
    def scored_by(self) -> str:
        """``--metric``'s words before its first group or wildcard (``val_acc``), as printed."""
        named = re.split(r"[\\(\[.*+?{|^$]", self.metric, maxsplit=1)[0].strip(" :=")
        return f"the printed {named or self.metric}"

    @property
    def user_values(self) -> JsonObject:
        """Its training's length as its parser read it (``verify.length``); its seed is its own code's."""
        return {k: v for k, v in self.length.items() if k in self.length_keys}

    @property
    def per_device(self) -> int:
        return self.batch

    @property
    def accumulation(self) -> int:
        return 1

    def skipped(self) -> dict[str, str]:
        """The knobs this loop cannot take, with the reason."""
        out = dict(NOT_EXPRESSIBLE)
        if self.loader_line is None:
            for knob in LOADER_KNOBS:
                out[knob] = "a plain loop without a DataLoader: its batches come from its own code"
        if self.batch_flag is None and self.loader_line is None:
            out["batch_size"] = ("a plain loop with no batch-size flag in its parser (--batch-size, --batch_size, "
                                 "--bs...) and no DataLoader: its batch is set in its own code")
        if self.module_name is None or not self.imports_torch:
            why = (f"a plain loop: the module its optimizer (line {self.optimizer_line}) trains has no name in the "
                   "script to patch" if self.module_name is None else "a plain loop that does not `import torch`")
            out["compile"] = why
            out["precision"] = why
        return out

    def baseline(self, cfg: TrialConfig) -> TrialConfig:
        """``cfg`` (the space's baseline) as the script sets its knobs: its batch and loader."""
        v = self.loader_values
        workers = int(v.get("num_workers") or 0)  # type: ignore[arg-type]
        prefetch = v.get("prefetch_factor")
        return cfg.replace(batch_size=self.batch, grad_accum=1, num_workers=workers,
                           precision=Precision.FP32, compile=CompileMode.OFF,
                           persistent_workers=bool(v.get("persistent_workers")) and workers > 0,
                           prefetch_factor=prefetch if workers and isinstance(prefetch, int) else None,
                           pin_memory=bool(v.get("pin_memory")) and cfg.device == Device.CUDA)

    def overrides(self, cfg: TrialConfig) -> JsonObject:
        """What differs for ``cfg`` from the script as written, in its own terms: its batch
        flag, its DataLoader's arguments (``DataLoader.NAME``), ``autocast`` and ``compile``."""
        base = self.baseline(cfg)
        out: JsonObject = {}
        # each rank's batch is its share of the global batch (a DDP script's flag is per rank)
        per_rank = cfg.micro_batch if cfg.nprocs > 1 else cfg.batch_size
        if per_rank != base.batch_size:
            out[self.batch_flag or "DataLoader.batch_size"] = per_rank
        if cfg.batch_size != base.batch_size:
            # a training of so many steps trains as many samples at the new (global) batch as at
            # yours: the job's time, not more samples in more time, is what the speedup is of
            steps = self.length.get("max_steps")
            if self.steps_flag and isinstance(steps, int):
                out[self.steps_flag] = max(1, round(steps * base.batch_size / cfg.batch_size))
        if self.loader_line is not None:
            want: dict[str, JsonValue] = {"num_workers": cfg.num_workers,
                                          "persistent_workers": cfg.persistent_workers and cfg.num_workers > 0}
            if cfg.num_workers and cfg.prefetch_factor:
                want["prefetch_factor"] = cfg.prefetch_factor
            if cfg.device == Device.CUDA:
                want["pin_memory"] = cfg.pin_memory
            for key, value in want.items():
                mine = self.loader_values.get(key)
                if key == "prefetch_factor" and mine is not None and not self.loader_values.get("num_workers"):
                    mine = None  # torch keeps no prefetch factor without workers
                if mine != value and not (key == "persistent_workers" and not value and not mine):
                    out[f"DataLoader.{key}"] = value
        if cfg.precision in DTYPES:
            out["autocast"] = DTYPES[cfg.precision]
        if cfg.precision == Precision.TF32 and cfg.device == Device.CUDA:
            out["matmul_precision"] = "high"
        if cfg.compile != CompileMode.OFF:
            out["compile"] = cfg.compile.value
        return out

    def edits(self, overrides: JsonObject) -> JsonObject:
        """``overrides`` as edits of the script's source (``runtime.loop_patch``)."""
        kwargs = {k.removeprefix("DataLoader."): repr(v) for k, v in overrides.items() if k.startswith("DataLoader.")}
        out: JsonObject = {}
        if kwargs and self.loader_line is not None:
            out["loader"] = {"line": self.loader_line, "kwargs": kwargs}
        m = self.module_name
        statements: list[JsonValue] = []
        if "matmul_precision" in overrides:
            statements.append(f"torch.set_float32_matmul_precision({overrides['matmul_precision']!r}){NOTE}")
        if "autocast" in overrides and m:
            device = "cuda" if self.device.startswith("cuda") else "cpu"
            statements.append(f"{m}.forward = torch.autocast({device!r}, dtype=torch.{overrides['autocast']})"
                              f"({m}.forward){NOTE}")
        if "compile" in overrides and m:
            mode = "" if overrides["compile"] == CompileMode.DEFAULT.value else f", mode={overrides['compile']!r}"
            statements.append(f"{m}.forward = torch.compile({m}.forward{mode}){NOTE}")
        if statements and self.optimizer_line is not None:
            out["after"] = {"line": self.optimizer_line, "statements": statements}
        return out

    def instructions(self, overrides: JsonObject, *, script: Path) -> list[str]:
        """tuned_arguments.md's lines: the flags to add, the lines to change, the patch that changes them."""
        out: list[str] = []
        flags = self.flags(overrides)
        if flags:
            command = shlex.join(["python", script.name, *self.argv_with(overrides)])
            out += [f"Add {'these flags' if len(flags) > 2 else 'this flag'} to your script's command line:", "",
                    "    " + shlex.join(flags), "", "The whole command:", "", "    " + command, ""]
            if self.steps_flag and self.steps_flag in overrides:
                out += [f"`{self.steps_flag} {overrides[self.steps_flag]}` keeps your training's samples at the "
                        f"larger batch ({self.length.get('max_steps')} steps of {self.batch}): the speedup is your "
                        "job's, not more samples in more time.", ""]
            if not self.metric:
                out += ["Nothing checked that your training reaches the quality it reaches today at this batch (no "
                        "--metric named what your script prints): compare it at both batches before you keep the "
                        "larger one, or keep yours with `--fix batch_size=N`.", ""]
        changes = [line for line in self.said(overrides) if line != " ".join(flags)]
        if changes:
            out += ["Change these in your script:", ""] + [f"- {line}" for line in changes]
            out += ["", f"`{PATCH_NAME}` makes these changes: in your script's folder, `patch -p1 < {PATCH_NAME}` "
                    f"(or `git apply {PATCH_NAME}`)."]
        return out

    def said(self, overrides: JsonObject) -> list[str]:
        """``overrides`` as the user would make them: flags, then the lines the patch changes."""
        out = [" ".join(self.flags(overrides))] if self.flags(overrides) else []
        loader = [f"{k.removeprefix('DataLoader.')}={v!r}" for k, v in overrides.items() if k.startswith("DataLoader.")]
        if loader:
            out.append(f"DataLoader(..., {', '.join(loader)}) at line {self.loader_line}")
        if "autocast" in overrides:
            out.append(f"{overrides['autocast']} autocast around {self.module_name}'s forward")
        if "compile" in overrides:
            out.append(f"torch.compile of {self.module_name}'s forward ({overrides['compile']})")
        if "matmul_precision" in overrides:
            out.append("TF32 matrix products (torch.set_float32_matmul_precision('high'))")
        return out

    @property
    def steps_flag(self) -> str | None:
        """The flag its parser sets its training's steps with (``--max_iters``), if any."""
        flag = self.length.get("steps_flag")
        return flag if isinstance(flag, str) else None

    def flags(self, overrides: JsonObject) -> list[str]:
        """What goes on the script's command line: its batch flag, and its steps' flag where the
        batch changes a training that runs so many steps."""
        out: list[str] = []
        for flag in (self.batch_flag, self.steps_flag):
            if flag and flag in overrides:
                out += [flag, str(overrides[flag])]
        return out

    def argv_with(self, overrides: JsonObject) -> list[str]:
        """The script's arguments with its flags' values (``flags``) replaced, added where absent."""
        argv = list(self.argv)
        for flag, value in zip(self.flags(overrides)[::2], self.flags(overrides)[1::2]):
            argv = _with_flag(argv, flag, value)
        return argv

    def trial(self, overrides: JsonObject, *, scored: bool = False) -> tuple[tuple[str, ...], JsonObject]:
        """What a trial runs for ``overrides``: the arguments, and what the stepper applies. Only a
        scored training (``scored``: the quality gates') runs the answer's length; a measurement
        and the numerics check end after steps of their own, so they run the script's own steps
        and ``MEASURED_EPOCHS`` times its epochs: a short training (a few seconds of epochs, fewer
        steps still at a larger batch) would end before verification's served rounds have."""
        if scored:
            return tuple(self.argv_with(overrides)), {"edits": self.edits(overrides)}
        if self.steps_flag:
            overrides = {k: v for k, v in overrides.items() if k != self.steps_flag}
        argv = self.argv_with(overrides)
        epochs, flag = self.length.get("epochs"), self.length.get("epochs_flag")
        if isinstance(epochs, int) and isinstance(flag, str):
            argv = _with_flag(argv, flag, str(epochs * MEASURED_EPOCHS))
        return tuple(argv), {"edits": self.edits(overrides)}

    def emitted(self, overrides: JsonObject, *, script: Path) -> dict[str, str]:
        """``tuned.patch``: the edits as a diff of the script (``patch -p1`` in its folder)."""
        from autotune.runtime import loop_patch

        edits = self.edits(overrides)
        return {PATCH_NAME: loop_patch.diff(script.read_text(), edits, script.name)} if edits else {}


def _with_flag(argv: list[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag``'s value replaced (``--flag V`` or ``--flag=V``), added where absent."""
    out: list[str] = []
    i, replaced = 0, False
    while i < len(argv):
        token = argv[i]
        if token == flag and i + 1 < len(argv):
            out += [token, value]
            i, replaced = i + 2, True
            continue
        if token.startswith(flag + "="):
            out.append(f"{flag}={value}")
            replaced = True
        else:
            out.append(token)
        i += 1
    return out if replaced else out + [flag, value]


# --- recognising one

def recognises(tree: ast.AST) -> bool:
    """A plain loop: it imports torch, calls ``backward()`` and an optimizer's ``step()``, and
    builds an optimizer (``X.optim.NAME(...)``, ``optim.NAME(...)``, a torch.optim name
    imported, or a method that returns one: ``configure_optimizers``)."""
    if not imports(tree, "torch"):
        return False
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
    attrs = {n.func.attr for n in calls if isinstance(n.func, ast.Attribute)}
    if "backward" not in attrs or "step" not in attrs:
        return False
    optim_names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                   and (n.module or "").startswith("torch.optim") for a in n.names}
    for call in calls:
        func = call.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Attribute) and func.value.attr == "optim":
            return True
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.value.id == "optim":
            return True
        if isinstance(func, ast.Name) and func.id in optim_names:
            return True
        if isinstance(func, ast.Attribute) and "optimizer" in func.attr.lower():
            return True
    return False


# --- the check, in its child process

def _explain(shown: str, path: str, exc: BaseException) -> str:
    from autotune.runtime.stepper import ScriptEnded

    if isinstance(exc, ContractError):
        return str(exc)
    if isinstance(exc, ScriptEnded) and exc.code == 2:
        return (f"{shown}: the script's argument parser refused the arguments after `--`: see its message above. "
                "Give the arguments the script takes (run `python SCRIPT --help`).")
    if isinstance(exc, ScriptEnded):
        return (f"{shown}: {exc}. autotune measures the training the script runs: make sure running "
                "`python SCRIPT [ARGS]` reaches its optimizer's step() (arguments for the script go after `--`: "
                "autotune run SCRIPT -- ARGS).")
    text = f"{type(exc).__name__}: {exc}".lower()
    if isinstance(exc, OSError) and any(w in text for w in ("download", "urlopen", "connection", "resolve", "http")):
        return (f"{shown}: the script tried to download something, and the check downloads nothing "
                "(nor do trials). Download it once, or point the script at a local copy, then run autotune "
                f"again.\n{own_frames(exc, path)}")
    return (f"{shown}: the script raised an error before its training's first steps:\n"
            f"{own_frames(exc, path)}")


def _check(path: str, argv: Sequence[str], out_dir: str) -> tuple[LoopFacts, float]:
    import torch

    from autotune.runtime.loop_script import LoopStepper

    shown = os.path.relpath(path)
    tree = ast.parse(Path(path).read_text())
    stepper = LoopStepper(path, argv, {})
    built = stepper.built
    try:
        stepper.start()
        stepper.run_steps(1)
        stepper.run_steps(1)
        step_s, _ = stepper.run_steps(1)
    except BaseException as exc:
        raise ContractError(_explain(shown, path, exc)) from None
    if len(built.optimizers) > 1:
        first = built.optimizer_record(built.optimizer) or built.optimizers[0]
        lines = ", ".join(f"line {o['line']} ({o['class']})" for o in built.optimizers)
        raise ContractError(
            f"{shown}:{built.optimizers[1]['line']}: the script builds {len(built.optimizers)} optimizers ({lines}). "
            f"autotune measures one training, and would measure the one that steps first, at line {first['line']}, "
            "as if it were the whole step: keep one optimizer (put the others behind a flag), then run autotune "
            "again.")
    record = built.optimizer_record(built.optimizer) or {}
    if built.module is None:
        raise ContractError(
            f"{shown}:{record.get('line', '?')}: autotune cannot tell which module the optimizer trains (no name in "
            "the script holds a module with all its parameters). Build the optimizer from a model the script "
            "names: `optimizer = torch.optim.AdamW(model.parameters())`, then run autotune again.")
    loader_record = built.loader_record()
    loader = built.loader
    try:
        dataset_len: int | None = len(loader.dataset) if loader is not None else None
    except TypeError:
        dataset_len = None
    flag = built.batch_flag or {}
    values = dict(loader_record["values"]) if loader_record else {}
    param = next(built.module.parameters(), None)
    return LoopFacts(
        argv=tuple(argv), optimizer_line=record.get("line"), optimizer_class=record.get("class", ""),
        module_name=built.module_name, loader_line=loader_record["line"] if loader_record else None,
        loader_values={k: v for k, v in values.items() if isinstance(v, (int, bool, float, str)) or v is None},
        batch_flag=flag.get("flag") if flag.get("value") is not None else None, flag_value=flag.get("value"),
        batch=max(1, built.step_samples), imports_torch=imports_torch_name(tree), image_inputs=built.image_inputs,
        model_class=type(built.module).__name__, parameters=sum(p.numel() for p in built.module.parameters()),
        dataset_len=dataset_len, device=str(param.device) if isinstance(param, torch.Tensor) else "cpu",
        length=dict(built.length), ddp_line=ddp_line(tree),
    ), step_s


def check_script(path: Path, argv: Sequence[str], *, timeout_s: float) -> tuple[LoopFacts, float]:
    """Run the check of the plain loop ``path`` with ``argv``; its facts and how long it took,
    or ContractError."""
    from autotune.task.child import check_script_in_child, explain_parser

    data, seconds = check_script_in_child("autotune.task.loop_script", path, argv, timeout_s=timeout_s,
                                          calls="its optimizer's step()", framework="torch", explain=explain_parser,
                                          steps="its training's first steps")
    return LoopFacts.from_json(data), seconds


WAY = WayIn(kind=KIND, facts=LoopFacts, recognises=recognises,
            check=lambda path, argv, timeout_s: check_script(path, argv, timeout_s=timeout_s),
            task_fields=lambda facts: {"image_inputs": facts.image_inputs, "optimizer":
                                       f"the script's {facts.optimizer_class} (line {facts.optimizer_line})"},
            after_model_file=True,
            with_metric=lambda facts, metric: dataclasses.replace(facts, metric=metric.pattern,
                                                                  greater_is_better=metric.greater_is_better))


if __name__ == "__main__":
    from autotune.task import loop_script
    from autotune.task.child import script_child_main

    script_child_main(loop_script._check, sys.argv[1:])
