"""What a run of a script the user runs leaves in place of train_tuned.py: ``run_tuned.py`` (a
short constant script of the way in's, from ``autotune/templates/``) with ``run_tuned.json``
(the tuned arguments, as data) and ``tuned_runtime/`` (the hooks the trials ran the script
with, copied unchanged), ``tuned_arguments.md``: what differs from the user's, in the form
their script takes it, and what else the way in emits (a plain loop's ``tuned.patch``)."""
from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from autotune.config import TrialConfig
from autotune.outdir import write_atomically
from autotune.runtime.json_value import JsonObject
from autotune.task.way_in import ScriptFacts

SCRIPT_NAME = "run_tuned.py"
SETTINGS_NAME = "run_tuned.json"
ARGUMENTS_NAME = "tuned_arguments.md"
RUNTIME_NAME = "tuned_runtime"

PACKAGE = Path(__file__).resolve().parent.parent
# what every way in's hooks and run_tuned.py stand on: the stepper its trials hold the script with
# (its class is the way in's), the end of a timed run (its training, and nothing after it),
# run_tuned.py's own command line, and its ranks (started over loopback as a model file's, joined on a file store)
SHARED_RUNTIME = tuple(PACKAGE / "runtime" / name
                       for name in ("stepper.py", "script_end.py", "run_tuned_args.py", "ranks.py", "script_ranks.py"))


def settings(cfg: TrialConfig, facts: ScriptFacts, *, script: Path, out_dir: Path, description: str) -> JsonObject:
    """run_tuned.json: the script (relative to the folder, and where it was when tuned), the
    arguments it was tuned with, the TrainingArguments fields that differ for ``cfg``, and
    those as flags for a script that parses them."""
    overrides = facts.overrides(cfg)
    _, applied = facts.trial(overrides)
    return {"description": description,
            "script": os.path.relpath(script.absolute(), out_dir.absolute()), "script_tuned": str(script.absolute()),
            "argv": list(facts.argv), "parsed": facts.parsed, "overrides": overrides, "applied": applied,
            "flags": facts.flags(overrides), "tuned_argv": facts.argv_with(overrides),
            "kind": facts.kind, "source_module": facts.source_module,
            "nprocs": cfg.nprocs, "backend": cfg.backend.value}


def arguments_text(cfg: TrialConfig, facts: ScriptFacts, *, script: Path, env: dict[str, str]) -> str:
    """tuned_arguments.md: what to change in the user's own command or code."""
    overrides = facts.overrides(cfg)
    name = script.name
    lines = [f"# The tuned arguments for {name}", ""]
    if not overrides:
        lines.append(f"None: your {facts.stack} are already the fastest verified ones.")
    else:
        lines += facts.instructions(overrides, script=script)
    if cfg.nprocs > 1:
        lines += ["", f"Run it as {cfg.nprocs} ranks: each trains a per-device batch of {cfg.micro_batch}"
                  + (f" ({cfg.grad_accum} micro-batches a step)" if cfg.grad_accum > 1 else "")
                  + f", the global batch is {cfg.batch_size}. launch.sh starts them over loopback; with "
                  f"your own launcher, `torchrun --nproc-per-node {cfg.nprocs} {name} ...`."]
    if env:
        lines += ["", "And run it with this environment (launch.sh sets it):", ""]
        lines += [f"    export {key}={shlex.quote(value)}" for key, value in env.items()]
    lines += ["", f"`./launch.sh` runs your script so; `python {SCRIPT_NAME} --as-written` runs it as it is."]
    return "\n".join(lines) + "\n"


def write_run_tuned(out_dir: Path, *, cfg: TrialConfig, facts: ScriptFacts, script: Path, env: dict[str, str],
                    description: str) -> dict[str, str]:
    """run_tuned.py and what it runs, and tuned_arguments.md, in ``out_dir``; returns the
    outputs by name."""
    runtime = out_dir / RUNTIME_NAME
    runtime.mkdir(parents=True, exist_ok=True)
    write_atomically(runtime / "__init__.py", b"")
    for source in (*(PACKAGE / "runtime" / hook for hook in facts.hooks), *SHARED_RUNTIME):
        write_atomically(runtime / source.name, source.read_bytes())
    data = settings(cfg, facts, script=script, out_dir=out_dir, description=description)
    write_atomically(out_dir / SETTINGS_NAME, json.dumps(data, indent=2) + "\n")
    write_atomically(out_dir / SCRIPT_NAME, (PACKAGE / "templates" / facts.template).read_bytes())
    write_atomically(out_dir / ARGUMENTS_NAME, arguments_text(cfg, facts, script=script, env=env))
    outputs = {"script": SCRIPT_NAME, "arguments": ARGUMENTS_NAME}
    for name, text in facts.emitted(facts.overrides(cfg), script=script).items():
        write_atomically(out_dir / name, text)
        outputs["patch"] = name
    return outputs
