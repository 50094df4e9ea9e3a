"""What a run of a script the user runs leaves in place of train_tuned.py: ``run_tuned.py`` (a
short constant script: ``autotune/templates/run_tuned.py`` for a Trainer script,
``run_tuned_lightning.py`` for a Lightning one) with ``run_tuned.json`` (the tuned arguments,
as data) and ``tuned_runtime/`` (the hooks the trials ran the script with, copied unchanged),
and ``tuned_arguments.md``: the arguments that differ from the user's, in the form their
script takes them."""
from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

from autotune.config import TrialConfig
from autotune.outdir import write_atomically
from autotune.runtime.json_value import JsonObject
from autotune.task.lightning_script import KIND as LIGHTNING
from autotune.task.lightning_script import LightningFacts
from autotune.task.trainer_script import ScriptFacts

SCRIPT_NAME = "run_tuned.py"
SETTINGS_NAME = "run_tuned.json"
ARGUMENTS_NAME = "tuned_arguments.md"
RUNTIME_NAME = "tuned_runtime"

PACKAGE = Path(__file__).resolve().parent.parent
TEMPLATES = {"hf_trainer": PACKAGE / "templates" / SCRIPT_NAME,
             LIGHTNING: PACKAGE / "templates" / "run_tuned_lightning.py"}
HOOKS = {"hf_trainer": PACKAGE / "runtime" / "hf_script.py", LIGHTNING: PACKAGE / "runtime" / "lightning_script.py"}
# what both kinds of hooks end a timed run with (its training, and nothing after it)
SCRIPT_END = PACKAGE / "runtime" / "script_end.py"
Facts = ScriptFacts | LightningFacts


def settings(cfg: TrialConfig, facts: Facts, *, script: Path, out_dir: Path, description: str) -> JsonObject:
    """run_tuned.json: the script (relative to the folder, and where it was when tuned), the
    arguments it was tuned with, the TrainingArguments fields that differ for ``cfg``, and
    those as flags for a script that parses them."""
    overrides = facts.overrides(cfg)
    return {"description": description,
            "script": os.path.relpath(script.absolute(), out_dir.absolute()), "script_tuned": str(script.absolute()),
            "argv": list(facts.argv), "parsed": facts.parsed, "overrides": overrides,
            "flags": facts.flags(overrides), "tuned_argv": facts.argv_with(overrides),
            "kind": facts.kind, "source_module": facts.source_module}


def arguments_text(cfg: TrialConfig, facts: Facts, *, script: Path, env: dict[str, str]) -> str:
    """tuned_arguments.md: what to change in the user's own command or code."""
    overrides = facts.overrides(cfg)
    name = script.name
    lines = [f"# The tuned arguments for {name}", ""]
    if isinstance(facts, LightningFacts):
        if not overrides:
            lines.append("None: your Trainer and DataLoader arguments are already the fastest verified ones.")
        else:
            lines += ["Change these in your script:", ""] + [f"- {line}" for line in facts.said(overrides)]
    elif not overrides:
        lines.append("None: your TrainingArguments are already the fastest verified ones.")
    elif facts.parsed:
        command = shlex.join(["python", name, *facts.argv_with(overrides)])
        lines += ["Your script parses its TrainingArguments: add these flags to its command line.", "",
                  "    " + shlex.join(facts.flags(overrides)), "", "The whole command:", "", "    " + command]
    else:
        where = f" (line {facts.args_line})" if facts.args_line else ""
        lines += [f"Your script builds its TrainingArguments in code{where}: set these keyword arguments there.", ""]
        lines += [f"    {key}={value!r}," for key, value in overrides.items()]
    if env:
        lines += ["", "And run it with this environment (launch.sh sets it):", ""]
        lines += [f"    export {key}={shlex.quote(value)}" for key, value in env.items()]
    lines += ["", f"`./launch.sh` runs your script so; `python {SCRIPT_NAME} --as-written` runs it as it is."]
    return "\n".join(lines) + "\n"


def write_run_tuned(out_dir: Path, *, cfg: TrialConfig, facts: Facts, script: Path, env: dict[str, str],
                    description: str) -> dict[str, str]:
    """run_tuned.py and what it runs, and tuned_arguments.md, in ``out_dir``; returns the
    outputs by name."""
    runtime = out_dir / RUNTIME_NAME
    runtime.mkdir(parents=True, exist_ok=True)
    write_atomically(runtime / "__init__.py", b"")
    hooks = HOOKS[facts.kind]
    for source in (hooks, SCRIPT_END):
        write_atomically(runtime / source.name, source.read_bytes())
    data = settings(cfg, facts, script=script, out_dir=out_dir, description=description)
    write_atomically(out_dir / SETTINGS_NAME, json.dumps(data, indent=2) + "\n")
    write_atomically(out_dir / SCRIPT_NAME, TEMPLATES[facts.kind].read_bytes())
    write_atomically(out_dir / ARGUMENTS_NAME, arguments_text(cfg, facts, script=script, env=env))
    return {"script": SCRIPT_NAME, "arguments": ARGUMENTS_NAME}
