"""The tests' stand-ins are what they stand in for: every runner double has each member of
``TrialRunnerLike``, every handle one starts each member of ``LiveTrialLike``, with
signatures that accept every call the protocol allows. mypy checks the real TrialRunner
against the protocols; the tests are not type-checked, so this checks the doubles, and
the real classes the same way (the check itself is checked by them)."""
from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from autotune.config import TrialConfig
from autotune.trials.runner import LiveTrial, LiveTrialLike, TrialResult, TrialRunner, TrialRunnerLike

from doubles import NoisyServing, RunnerDouble, ScriptedRunner, ServingCounter, StandInRunner, recorded_machine
from helpers import MODELS
from simulated_gpu_node import SimulatedGpuNode

POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def refusals(method: Callable[..., Any], spec: Callable[..., Any]) -> list[str]:
    """Calls the protocol's ``spec`` allows that the bound ``method`` would refuse."""
    wanted = list(inspect.signature(spec).parameters.values())[1:]  # without self
    have = inspect.signature(method).parameters
    kinds = {p.kind for p in have.values()}
    positional = [p for p in have.values() if p.kind in POSITIONAL]
    found = []
    for i, p in enumerate(wanted):
        if p.kind in POSITIONAL:
            q = positional[i] if i < len(positional) else None
            takes = (q is not None and (q.name == p.name or p.kind is p.POSITIONAL_ONLY)) or \
                (q is None and inspect.Parameter.VAR_POSITIONAL in kinds)
        else:
            q = have.get(p.name)
            takes = (q is not None and q.kind in BY_NAME) or \
                (q is None and inspect.Parameter.VAR_KEYWORD in kinds)
        if not takes:
            found.append(f"takes no {p.name}")
        elif q is not None and p.default is not p.empty and q.default is q.empty:
            found.append(f"requires {p.name}, which the protocol leaves optional")
    named = {p.name for p in wanted}
    found += [f"requires {q.name}, which the protocol never passes" for q in have.values()
              if q.default is q.empty and q.kind in (*POSITIONAL, q.KEYWORD_ONLY) and q.name not in named]
    return found


def unmet(obj: object, protocol: type) -> dict[str, list[str]]:
    """Per member of ``protocol`` that ``obj`` lacks or cannot be called as, why."""
    out: dict[str, list[str]] = {}
    for name in protocol.__annotations__:  # the data members
        if not hasattr(obj, name):
            out[name] = ["missing"]
    for name, spec in vars(protocol).items():
        if name.startswith("_") or not callable(spec):
            continue
        method = getattr(obj, name, None)
        problems = ["missing"] if not callable(method) else refusals(method, spec)
        if problems:
            out[name] = problems
    return out


RUNNERS: dict[str, Callable[[Path], Any]] = {
    "TrialRunner": lambda tmp: TrialRunner(model_file=MODELS / "tiny_cnn.py", machine={}, workdir=tmp),
    "RunnerDouble": lambda tmp: RunnerDouble(),
    "StandInRunner": lambda tmp: StandInRunner(recorded_machine("avx2_epyc")),
    "SimulatedGpuNode": lambda tmp: SimulatedGpuNode(recorded_machine("h100x1")),
    "ScriptedRunner": lambda tmp: ScriptedRunner(losses={}, metric={}),
    "ServingCounter": lambda tmp: ServingCounter(),
    "NoisyServing": lambda tmp: NoisyServing(lambda cfg: 1.0),
}


def test_the_check_tells_a_signature_that_refuses_a_call():
    class Narrow:
        def run(self, cfg, *, name, trajectory_steps): ...  # no on_window; a required optional

    problems = refusals(Narrow().run, TrialRunnerLike.run)
    assert "takes no on_window" in problems and "takes no quality_steps" in problems
    assert "requires trajectory_steps, which the protocol leaves optional" in problems
    assert unmet(Narrow(), TrialRunnerLike).keys() == {"workdir", "memory_limit_bytes", "timeout_s", "run", "start",
                                                       "run_script", "start_script", "close"}


@pytest.mark.parametrize("name", RUNNERS)
def test_each_runner_double_is_a_trial_runner(name, tmp_path):
    assert unmet(RUNNERS[name](tmp_path), TrialRunnerLike) == {}


@pytest.mark.parametrize("name", ["StandInRunner", "SimulatedGpuNode", "ServingCounter"])
def test_what_each_double_starts_is_a_live_trial(name, tmp_path):
    cfg = TrialConfig(device="cuda", backend="nccl", batch_size=16) if name == "SimulatedGpuNode" \
        else TrialConfig(batch_size=16)
    live = RUNNERS[name](tmp_path).start(cfg, name="served", mode=None)
    try:
        assert unmet(live, LiveTrialLike) == {}
    finally:
        live.kill()


def test_the_real_live_trial_is_one_too():
    assert unmet(LiveTrial.failed_to_start(TrialResult(status="failed")), LiveTrialLike) == {}
