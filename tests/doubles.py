"""The tests' stand-ins for autotune's trial runner, in one place.

Every runner here is a ``TrialRunnerLike`` and every handle its ``start`` returns a
``LiveTrialLike`` (autotune/trials/runner.py): what the search and verification call.
The tests are not type-checked, so tests/test_doubles.py checks each against those
protocols' members and signatures. A double that serves only part of the protocol
inherits the rest from ``RunnerDouble``, which fails loudly instead of guessing.

- ``StandIn``: measures nothing. A configuration runs at ``throughput(cfg)`` after a
  one-time cost of ``one_time_s(cfg)`` (none unless a subclass models one: a compile);
  its losses track fp32's or, with ``diverge``, reduced precision grows from the first
  step, and evaluate() falls with it; a profiled run (``profile=True``) reports
  ``step_profile(cfg)``, the ``profiles`` given (None by default). The base of ``StandInRunner`` and of the simulated GPU node
  (tests/simulated_gpu_node.py).
- ``StandInRunner``: the whole pipeline on a recorded machine (``recorded_machine``);
  ``tune_stand_in`` runs it.
- ``ScriptedRunner``: losses and evaluate() scores given per precision.
- ``ServingCounter``: serves configurations and counts how many are alive at once.
- ``NoisyServing``: serves configurations at given speeds with seeded noise, and records
  each one's windows and when it was ended.
"""
from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune import pipeline
from autotune.config import TrialConfig
from autotune.options import RunOptions
from autotune.report.console import Reporter
from autotune.runtime.step_profile import StepProfile
from autotune.task import Task
from autotune.trials.events import DoneEvent, WarmupEvent
from autotune.trials.logs import read_event
from autotune.trials.protocol import Mode
from autotune.trials.runner import LiveTrialLike, TrialResult
from autotune.trials.script_report import ScriptReport

from helpers import written_document

MACHINE_DOCS = Path(__file__).parent / "fixtures" / "machines"


def recorded_machine(name: str) -> dict:
    """The probe document recorded on a machine this suite may not run on
    (tests/fixtures/machines: avx2_epyc, amx_spr, h100x1, h100x8, ...)."""
    return json.loads((MACHINE_DOCS / f"{name}.json").read_text())


class RunnerDouble:
    """A ``TrialRunnerLike`` that runs nothing: each double overrides what its tests use."""

    workdir: Path = Path("trials")
    memory_limit_bytes: int | None = None  # verification's shared budget: not measured here
    timeout_s: float = RunOptions.trial_timeout_s

    def run(self, cfg: TrialConfig, *, name: str, on_window: Callable[[int, float], bool] | None = None,
            trajectory_steps: int | None = None, quality_steps: int | None = None,
            timeout_s: float | None = None, profile: bool = False, seed_offset: int = 0,
            evaluate_at: tuple[int, ...] = (), guard: Any = None) -> TrialResult:
        raise NotImplementedError(f"{type(self).__name__} runs no trial ({name})")

    def start(self, cfg: TrialConfig, *, name: str, mode: Any = None) -> LiveTrialLike:
        raise NotImplementedError(f"{type(self).__name__} serves no trial ({name})")

    def run_script(self, launcher: Path, *, steps: int, workdir: Path, timeout_s: float) -> ScriptReport:
        raise NotImplementedError(f"{type(self).__name__} runs no script ({launcher})")

    def start_script(self, launcher: Path, *, steps: int, workdir: Path, timeout_s: float) -> DeferredScript:
        """A run started ahead of its turn: here it runs (``run_script``) when let go."""
        return DeferredScript(lambda: self.run_script(launcher, steps=steps, workdir=workdir, timeout_s=timeout_s))

    def close(self) -> None:
        """No idle processes to end."""

    def shutdown(self) -> None:
        """No warm processes or interpreters to end."""


class DeferredScript:
    """A ``ScriptRunLike`` of a double: its run is ``run`` called when it is let go."""

    def __init__(self, run: Callable[[], ScriptReport]) -> None:
        self.run, self.cancelled = run, False

    def finish(self) -> ScriptReport:
        return self.run()

    def cancel(self) -> None:
        self.cancelled = True


class ServedTrial:
    """A ``LiveTrialLike`` held for verification: each window runs at ``value``, within 2%."""

    def __init__(self, value: float) -> None:
        self.value, self.rounds, self.result = value, 0, TrialResult(status="ok")

    def wait_ready(self) -> bool:
        return True

    def window(self) -> float | None:
        self.rounds += 1
        return self.value * (1 + 0.01 * (self.rounds % 3))

    def kill(self) -> None:
        pass

    def memory(self) -> int:
        return 0


class StandIn(RunnerDouble):
    """Measures nothing: subclasses say how fast a configuration runs (``throughput``)."""

    diverge: bool = False

    def __init__(self, *, profiles: Callable[[TrialConfig], StepProfile | None] = lambda cfg: None) -> None:
        self.gated: list[TrialConfig] = []  # configurations the gates trained
        self.gated_seeds: list[tuple[TrialConfig, int]] = []  # and the seed each trained from
        self.measured: list[TrialConfig] = []  # configurations the search measured
        self.profiled: list[TrialConfig] = []  # configurations run with profile=True
        self.limits: list[tuple[TrialConfig, float | None]] = []  # each run's timeout_s, as given
        self.profiles = profiles  # what a profiled run of a configuration reports

    def step_profile(self, cfg: TrialConfig) -> StepProfile | None:
        """Where a profiled run of ``cfg`` finds its step going: the ``profiles`` given."""
        return self.profiles(cfg)

    def throughput(self, cfg: TrialConfig) -> float:
        raise NotImplementedError

    def threads_seen(self, cfg: TrialConfig) -> int:
        """What a trial reports as its threads (torch's default where cfg leaves them)."""
        return cfg.threads or 1

    def one_time_s(self, cfg: TrialConfig) -> float:
        """Seconds a trial of ``cfg`` pays once, in its first step (where compiling lands):
        reported as a measured trial reports it (``TrialResult.one_time_s``)."""
        return 0.0

    def measured_done(self, cfg: TrialConfig) -> dict[str, Any]:
        """What a measured trial reports at its end, beside its windows."""
        return {}

    def utilisation(self, cfg: TrialConfig) -> dict[str, Any]:
        """What a trial's first step reports for utilisation (trials.step_facts): the
        model's FLOPs per sample and its ranks' peak, the datasheet's for a GPU the
        machine document names, else a matmul's 50 GFLOP/s a thread."""
        from autotune.probes import peaks

        doc = getattr(self, "doc", None) or {}  # the recorded machine, where the double has one
        gpu = (doc.get("gpus") or [{}])[0].get("name") if cfg.device == "cuda" else None
        threads = self.threads_seen(cfg)
        peak = peaks.device_peak(
            device_type=cfg.device, gpu_name=gpu, precision=cfg.precision, ranks=cfg.nprocs,
            measure=lambda p: peaks.Peak(flop_per_s=5e10 * threads, source=f"measured:cpu {p} matmul, {threads} "
                                         "threads").times(cfg.nprocs))
        return {"flops_per_sample": 1e7, **peak.to_json()}

    def losses(self, cfg: TrialConfig, steps: int) -> list[float]:
        if self.diverge and not cfg.exact:
            return [2.3 * 1.03 ** i for i in range(steps)]
        wobble = 0.0 if cfg.exact else 0.01
        return [2.3 * 0.97 ** i * (1 + wobble * (-1) ** i) for i in range(steps)]

    def result(self, cfg: TrialConfig, *, on_window: Any = None, trajectory_steps: int | None = None,
               quality_steps: int | None = None, profile: bool = False) -> TrialResult:
        """A trial of ``cfg`` in the mode the arguments ask: a loss trajectory, a quality
        run, a profiled window (``step_profile(cfg)``, no measurement), or three measured
        windows (reported to ``on_window``, which may prune)."""
        if profile:
            self.profiled.append(cfg)
            return TrialResult(status="ok", done=DoneEvent(mode=Mode.PROFILE, step_profile=self.step_profile(cfg),
                                                           samples_per_s=self.throughput(cfg)))
        if trajectory_steps is not None:
            self.gated.append(cfg)
            return TrialResult(status="ok", done=read_event({"e": "done", "losses": self.losses(cfg, trajectory_steps)}))
        if quality_steps is not None:
            self.gated.append(cfg)
            metric = 0.5 if self.diverge and not cfg.exact else 0.9
            return TrialResult(status="ok", done=read_event({"e": "done", "metric": metric,
                                                                      "losses": self.losses(cfg, quality_steps)}))
        self.measured.append(cfg)
        value = self.throughput(cfg)
        for i in range(3):
            if on_window is not None and on_window(i, value):
                return TrialResult(status="pruned")
        step_s = cfg.batch_size / value
        return TrialResult(status="ok", value=value, values=[value] * 3, iqr=0.0,
                           setup=read_event({"e": "setup", "threads": self.threads_seen(cfg), "seconds": 0.0}),
                           facts={"utilisation": self.utilisation(cfg)},
                           warmup=WarmupEvent(first_step_s=step_s + self.one_time_s(cfg), step_s=step_s),
                           done=read_event({"e": "done", **self.measured_done(cfg)}))


class StandInRunner(StandIn):
    """Measures nothing (``StandIn``) on a recorded machine document. Reduced precision
    is fast where the hardware has it (bf16 2x on AMX; fp16 2.2x, bf16 2x, tf32 1.4x on
    an H100)."""

    def __init__(self, doc: dict, *, diverge: bool = False,
                 served: Callable[[TrialConfig], float] = lambda cfg: 1.0,
                 profiles: Callable[[TrialConfig], StepProfile | None] = lambda cfg: None) -> None:
        super().__init__(profiles=profiles)
        self.doc, self.diverge = doc, diverge
        self.served = served  # held side by side, a configuration runs this much faster
        self.scripts: list[Path] = []

    def throughput(self, cfg: TrialConfig) -> float:
        isa = self.doc["cpu"]["isa"]
        fast = ({"fp16": 2.2, "bf16": 2.0, "tf32": 1.4} if cfg.device == "cuda"
                else {"bf16": 2.0 if isa.get("amx_bf16") else 0.5})
        value = 1000.0 * fast.get(cfg.precision, 1.0) * (1 + 0.1 * math.log2(cfg.batch_size / 16))
        value *= 0.95 ** cfg.nprocs * cfg.nprocs if cfg.device == "cuda" else 1 + 0.05 * (cfg.threads or 1)
        return value * (1.1 if cfg.num_workers else 1.0) * (1.05 if cfg.compile != "off" else 1.0)

    def threads_seen(self, cfg: TrialConfig) -> int:
        return cfg.threads or self.doc["cpu"]["usable_cores"]

    def run(self, cfg, *, name, on_window=None, trajectory_steps=None, quality_steps=None, timeout_s=None,
            profile=False, **kw):
        self.limits.append((cfg, timeout_s))
        if trajectory_steps is not None or quality_steps is not None:
            self.gated_seeds.append((cfg, kw.get("seed_offset", 0)))
        return self.result(cfg, on_window=on_window, trajectory_steps=trajectory_steps,
                           quality_steps=quality_steps, profile=profile)

    def start(self, cfg, *, name, mode=None, **kw):
        return ServedTrial(self.throughput(cfg) * self.served(cfg))

    def run_script(self, launcher, *, steps, workdir, timeout_s):
        """Alone, the emitted configuration (read back from what was written beside
        the launcher) runs at its throughput."""
        self.scripts.append(Path(launcher))
        written = json.loads((Path(launcher).parent / "best_config.json").read_text())
        cfg = TrialConfig.from_dict(written.get("candidate") or written["config"])
        return ScriptReport(samples_per_s=self.throughput(cfg))


def tune_stand_in(task: Task, tmp_path: Path, runner: StandInRunner, **options: Any) -> dict:
    """The whole run (8 trials unless ``options`` say otherwise) on ``runner``'s machine,
    written to ``tmp_path / "out"``; returns best_config.json as written there."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    pipeline.execute(task, out, pipeline.RunOptions(**{"trials": 8, **options}),
                     machine=runner.doc, runner=runner, reporter=Reporter(quiet=True))
    return written_document(out)


class ScriptedRunner(RunnerDouble):
    """Trains nothing: a trajectory's losses and evaluate()'s score are given per
    precision. ``runs`` holds the configurations run, in order."""

    def __init__(self, *, losses: dict[str, list[float]], metric: dict[str, float]) -> None:
        self.losses, self.metric = losses, metric
        self.runs: list[TrialConfig] = []

    def run(self, cfg, *, name, on_window=None, trajectory_steps=None, quality_steps=None, **kw):
        self.runs.append(cfg)
        if trajectory_steps is not None:
            return TrialResult(status="ok",
                               done=read_event({"e": "done", "losses": self.losses[cfg.precision][:trajectory_steps]}))
        return TrialResult(status="ok", done=read_event({"e": "done",
            "metric": self.metric[cfg.precision], "losses": self.losses.get(cfg.precision, [1.0])[:quality_steps]}))


class ServingCounter(RunnerDouble):
    """Serves configurations, each at 100 samples/s per sample of its batch, and counts
    how many are alive at once (``most``); ``started`` holds the trials' names."""

    workdir = Path("t")

    def __init__(self) -> None:
        self.alive, self.most = 0, 0
        self.started: list[str] = []

    def start(self, cfg, *, name, mode=None, **kw):
        self.alive += 1
        self.most = max(self.most, self.alive)
        self.started.append(name)
        return _CountedTrial(self, 100.0 * cfg.batch_size)


class _CountedTrial:
    def __init__(self, counter: ServingCounter, value: float) -> None:
        self.counter, self.value, self.result = counter, value, TrialResult(status="ok")

    def wait_ready(self) -> bool:
        return True

    def window(self) -> float | None:
        return self.value

    def kill(self) -> None:
        self.counter.alive -= 1

    def memory(self) -> int:
        return 0


class NoisyServing(RunnerDouble):
    """Serves configurations held side by side: each window runs at ``speed(cfg)`` times
    log-normal noise of ``noise`` (seeded), and by ``wobble(cfg)`` faster and slower in
    turn (a configuration as fast as another, whose windows straddle it). ``events``
    holds ("start", name), ("ready", name), ("window", name) and ("kill", name) in the
    order they happened; ``windows``
    counts each one's windows."""

    workdir = Path("t")

    def __init__(self, speed: Callable[[TrialConfig], float], *, noise: float = 0.02,
                 wobble: Callable[[TrialConfig], float] = lambda cfg: 0.0, seed: int = 0) -> None:
        self.speed, self.noise, self.wobble = speed, noise, wobble
        self.rng = random.Random(seed)
        self.events: list[tuple[str, str]] = []
        self.windows: dict[str, int] = {}

    def start(self, cfg, *, name, mode=None, **kw):
        self.windows[name] = 0
        self.events.append(("start", name))
        return _NoisyTrial(self, name, self.speed(cfg), self.wobble(cfg))


class _NoisyTrial:
    def __init__(self, serving: NoisyServing, name: str, value: float, wobble: float) -> None:
        self.serving, self.name, self.value, self.wobble = serving, name, value, wobble
        self.result = TrialResult(status="ok")
        self.killed = False

    def wait_ready(self) -> bool:
        self.serving.events.append(("ready", self.name))
        return True

    def window(self) -> float | None:
        assert not self.killed, f"{self.name} was measured after it was ended"
        self.serving.events.append(("window", self.name))
        self.serving.windows[self.name] += 1
        turn = 1 + self.wobble * (-1) ** self.serving.windows[self.name]
        return self.value * turn * math.exp(self.serving.rng.gauss(0.0, self.serving.noise))

    def kill(self) -> None:
        if not self.killed:
            self.serving.events.append(("kill", self.name))
        self.killed = True

    def memory(self) -> int:
        return 0


class NamedStandIn(StandInRunner):
    """``StandInRunner``, keeping each run's name: the ramp's are ``batch-ramp-N``, the gates' ``verify-gates-N-ROLE``."""

    def __init__(self, doc: dict) -> None:
        super().__init__(doc)
        self.names: list[tuple[str, TrialConfig]] = []

    def run(self, cfg, *, name, **kw):
        self.names.append((name, cfg))
        return super().run(cfg, name=name, **kw)
