"""The time-to-train objective: the run the user plans (``--train-steps``, ``--epochs``),
how long it would take in a configuration, and after how many steps compiling pays for
itself.

Without a plan the search ranks configurations by steady throughput, as for a run of
endless length. With one, by the planned run's predicted wall time: the configuration's
one-time cost (``TrialResult.one_time_s``: its own setup, and the first step's excess over
a steady step, where torch.compile compiles and DataLoader workers start) plus the planned
samples at its steady rate. The process's own start (imports, the model file's
``build_dataset``) costs every configuration alike and is left out of every prediction.
The Optuna study still maximizes: a trial's value is its effective throughput, the
planned samples over that predicted time, which orders configurations as their predicted
times do and equals the steady throughput for an endless run; the pruner, the sampler and
the dashboard read it as they read throughput.

Planned steps are counted at the user's own (the baseline's) global batch, so the planned
work is the same samples whatever batch a configuration trains with; an epoch is the data
set's length in samples.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence

from pydantic import computed_field

from autotune.config import TrialConfig
from autotune.errors import UsageError
from autotune.runtime.json_value import JsonValue
from autotune.runtime.knobs import CompileMode
from autotune.schemas.typed import Omitted, Record


def duration(seconds: float) -> str:
    """Seconds as a person reads them: 41 s, 7.5 min, 2.3 h."""
    if seconds < 120:
        return f"{seconds:,.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:,.1f} min"
    return f"{seconds / 3600:,.1f} h"


def per_step(seconds: float) -> str:
    """A step's share of time: 22 ms, 0.4 ms, 1.3 s."""
    ms = abs(seconds) * 1e3
    if ms >= 1000:
        return f"{abs(seconds):.1f} s"
    return f"{ms:.0f} ms" if ms >= 10 else f"{ms:.1f} ms"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlannedRun(Record):
    """The run the user plans: ``samples`` of training, given as ``train_steps`` at
    ``batch_size`` (the user's own global batch) or as ``epochs`` of ``dataset_len`` samples."""

    samples: int
    batch_size: int
    train_steps: Omitted[int] = None
    epochs: Omitted[int] = None
    dataset_len: Omitted[int] = None

    @classmethod
    def of(cls, *, train_steps: int | None, epochs: int | None, batch_size: int,
           dataset_len: int | None) -> PlannedRun | None:
        """The plan of ``--train-steps`` or ``--epochs`` (``RunOptions`` checked them) for a
        model file of ``batch_size`` and ``dataset_len``; None when neither was given."""
        if train_steps is not None:
            return cls(samples=train_steps * batch_size, batch_size=batch_size, train_steps=train_steps)
        if epochs is None:
            return None
        if dataset_len is None:
            raise UsageError(
                f"--epochs {epochs}: the model file's data set has no length (an iterable data "
                "set), so an epoch's size is unknown; give the run you plan as --train-steps N "
                f"instead (N steps at your batch size, {batch_size})")
        return cls(samples=epochs * dataset_len, batch_size=batch_size, epochs=epochs,
                   dataset_len=dataset_len)

    @property
    def steps(self) -> float:
        """The planned run's steps at the user's batch size."""
        return self.samples / self.batch_size

    def predicted_s(self, *, samples_per_s: float, one_time_s: float | None) -> float:
        """The planned run's wall time at this steady rate after this one-time cost."""
        return (one_time_s or 0.0) + self.samples / samples_per_s

    def effective(self, *, samples_per_s: float, one_time_s: float | None) -> float:
        """The planned samples over the predicted time: the search's value under a plan."""
        return self.samples / self.predicted_s(samples_per_s=samples_per_s, one_time_s=one_time_s)

    def describe(self) -> str:
        if self.epochs is not None:
            return (f"{self.epochs:,} epoch{'s' if self.epochs != 1 else ''} of "
                    f"{self.dataset_len or 0:,} samples")
        return f"{self.train_steps or 0:,} steps at batch {self.batch_size}"


def described(plan: Mapping[str, JsonValue] | None) -> str:
    """A plan as stored (``PlannedRun.to_json``), or none, in words."""
    if plan is None:
        return "no planned run (steady throughput, as without --train-steps and --epochs)"
    return f"a planned run of {PlannedRun.from_json(plan).describe()}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Measured:
    """One configuration as the search measured it: its steady rate (the median window)
    and its one-time cost (None where the trial did not report one)."""

    config: TrialConfig
    samples_per_s: float
    one_time_s: float | None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Pricing:
    """A plan with the one-time costs the search measured: what verification prices its
    candidates with. Verification measures steady rates only (side by side, then the
    scripts alone); a configuration's one-time cost is the search's."""

    plan: PlannedRun
    measured: tuple[Measured, ...]

    def one_time_s(self, cfg: TrialConfig) -> float:
        """``cfg``'s one-time cost as the search measured it. One it did not measure (the
        layout contrast, ablation's simplified configuration) costs what the measured ones
        with its compile mode on its device cost (their median): compiling dominates it."""
        for m in self.measured:
            if m.config == cfg and m.one_time_s is not None:
                return m.one_time_s
        like = [m.one_time_s for m in self.measured if m.one_time_s is not None
                and m.config.compile == cfg.compile and m.config.device == cfg.device]
        return statistics.median(like) if like else 0.0

    def predicted_s(self, cfg: TrialConfig, samples_per_s: float) -> float:
        return self.plan.predicted_s(samples_per_s=samples_per_s, one_time_s=self.one_time_s(cfg))

    def price(self, speeds: Sequence[tuple[TrialConfig, Sequence[float], float]]) -> list[tuple[float, float]]:
        """Each candidate's planned run (``speeds``: config, its side-by-side rates, its rate
        relative to the candidates' level as ``verdict.rank_by_rounds`` ranks them): its
        predicted time and its one-time cost. A candidate's rate is its relative rate times
        that level (the geometric mean of their median windows): without one-time costs,
        the order is the one without a plan."""
        if not speeds:
            return []
        level = math.exp(statistics.fmean(math.log(max(statistics.median(rates), 1e-9))
                                          for _, rates, _ in speeds))
        return [(self.predicted_s(cfg, max(relative * level, 1e-9)), self.one_time_s(cfg))
                for cfg, _, relative in speeds]


@dataclasses.dataclass(frozen=True, kw_only=True)
class BreakEven(Record):
    """After how many steps a compiled configuration's extra one-time cost is paid back by
    the time it saves a step against its eager twin (the same configuration with
    compile=off), both as the search measured them; steps at the compiled configuration's
    batch. ``steps`` is None where it never is: no twin was measured, or compiling is not
    faster per step (``saved_per_step_s`` 0 or less)."""

    config: TrialConfig
    twin: TrialConfig | None  # None: the eager twin was not measured
    one_time_s: float | None = None  # compiling's extra one-time seconds over the twin
    saved_per_step_s: float | None = None
    steps: float | None = None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def config_short(self) -> str:
        return self.config.short()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def compile(self) -> CompileMode:
        return CompileMode(self.config.compile)

    def line(self, *, plan: PlannedRun | None = None) -> str:
        """One line for the summary; with the ``plan``, how many such steps it has."""
        what = f"compile={self.config.compile}"
        eager = self.config.replace(compile=CompileMode.OFF.value).short()
        if self.twin is None:
            return (f"{what} ({self.config.short()}): no break-even, its eager twin ({eager}) "
                    "was not measured in the search")
        if self.one_time_s is None or self.saved_per_step_s is None:
            return f"{what} (on {eager}): no break-even, a one-time cost was not measured"
        on = f" (on {eager})"
        if self.steps is None:
            return (f"{what} never pays off: not faster per step ({per_step(self.saved_per_step_s)} "
                    f"{'slower' if self.saved_per_step_s < 0 else 'saved'} a step, "
                    f"{duration(max(0.0, self.one_time_s))} of compiling){on}")
        batch = self.config.batch_size
        at = f" of batch {batch}" if plan is not None and plan.batch_size != batch else ""
        planned = f"; the planned run has {math.ceil(plan.samples / batch):,}" if plan is not None else ""
        if self.steps == 0:
            return (f"{what} pays off from the first step: no extra one-time cost was measured, "
                    f"{per_step(self.saved_per_step_s)} saved a step{on}")
        return (f"{what} pays off after {math.ceil(self.steps):,} steps{at}: {duration(self.one_time_s)} "
                f"of compiling, {per_step(self.saved_per_step_s)} saved a step{planned}{on}")


def break_even(compiled: Measured, twin: Measured | None) -> BreakEven:
    """``compiled`` against ``twin`` (the same configuration eager), as the search measured them."""
    if twin is None:
        return BreakEven(config=compiled.config, twin=None)
    if compiled.one_time_s is None or twin.one_time_s is None:
        return BreakEven(config=compiled.config, twin=twin.config)
    batch = compiled.config.batch_size
    saved = batch / twin.samples_per_s - batch / compiled.samples_per_s
    extra = compiled.one_time_s - twin.one_time_s
    return BreakEven(config=compiled.config, twin=twin.config, one_time_s=extra, saved_per_step_s=saved,
                     steps=max(0.0, extra) / saved if saved > 0 else None)


def break_evens(measured: Sequence[Measured]) -> list[BreakEven]:
    """Each compiled configuration the search measured against its eager twin, in the
    order given (the search's ranking)."""
    by_cfg = {m.config: m for m in measured}
    return [break_even(m, by_cfg.get(m.config.replace(compile=CompileMode.OFF.value)))
            for m in measured if m.config.compile != CompileMode.OFF]
