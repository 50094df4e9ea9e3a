"""The ways in hold: every script a user runs is entered through ``task.way_in.ScriptFacts``, and
no module outside a way in's own (its task module, its runtime module) names its facts class,
its Stepper, its kind or imports it: a fifth way in is its own modules and one line in
``task.ways``. The worker speaks to one typed session, with no ``type: ignore``."""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from autotune.task.way_in import ScriptFacts, WayIn
from autotune.task.ways import ways

PACKAGE = Path(__file__).resolve().parent.parent / "autotune"
# speak of every way in by design: the registry and the stepper all of them share
COMMON = {"autotune.task.way_in", "autotune.task.ways", "autotune.runtime.stepper"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def own_modules(way: WayIn) -> set[str]:
    return {way.recognises.__module__, way.facts.stepper.partition(":")[0]}


def mentions(source: str, way: WayIn) -> list[str]:
    """What ``source`` names of ``way``: its facts class, its Stepper, its modules, its kind
    compared or given as a string."""
    stepper_module, _, stepper = way.facts.stepper.partition(":")
    names = {way.facts.__name__, stepper}
    modules = own_modules(way)
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and node.id in names or isinstance(node, ast.Attribute) and node.attr in names:
            found.append(f"line {node.lineno}: {getattr(node, 'id', None) or getattr(node, 'attr', '')}")
        elif isinstance(node, ast.ImportFrom) and (node.module in modules or any(
                f"{node.module}.{a.name}" in modules for a in node.names)):
            found.append(f"line {node.lineno}: imports {node.module}")
        elif isinstance(node, ast.Import) and any(a.name in modules for a in node.names):
            found.append(f"line {node.lineno}: imports {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                if isinstance(side, ast.Constant) and side.value == way.kind:
                    found.append(f"line {node.lineno}: compares with {way.kind!r}")
    return found


def outside_mentions() -> list[str]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = module_name(path)
        if name in COMMON or "templates" in path.parts:
            continue
        for way in ways():
            if name not in own_modules(way):
                out += [f"{name} {m}" for m in mentions(path.read_text(), way)]
    return out


def test_no_module_outside_a_way_in_names_it():
    assert outside_mentions() == []


@pytest.mark.parametrize("source", [
    "from autotune.task.loop_script import LoopFacts\n",
    "def f(task):\n    return task.kind == 'loop'\n",
    "def f(script):\n    return isinstance(script, LightningFacts)\n",
    "from autotune.runtime import hf_script\n",
    "import autotune.task.trainer_script\n",
    "x = stepper.HfStepper\n",
])
def test_the_check_would_catch_a_stage_that_names_a_way_in(source):
    assert any(mentions(source, way) for way in ways())


def test_every_way_in_answers_the_whole_interface():
    members = [m for m in dir(ScriptFacts) if not m.startswith("_")]
    for way in ways():
        missing = [m for m in members if not hasattr(way.facts, m) and m not in way.facts.__dataclass_fields__]
        assert missing == [], way.kind
        module, _, name = way.facts.stepper.partition(":")
        __import__(module)
        stepper = getattr(sys.modules[module], name)
        assert stepper.for_trial is not stepper.__mro__[1].for_trial, way.kind  # its own trial's stepper
        for hook in way.facts.hooks:
            assert (PACKAGE / "runtime" / hook).is_file(), hook
        assert (PACKAGE / "templates" / way.facts.template).is_file()


def test_the_worker_speaks_to_one_typed_session():
    text = (PACKAGE / "trials" / "worker.py").read_text()
    assert "type: ignore" not in text
    assert text.count("def run_spec(") == 1 and "run_script_spec" not in text
