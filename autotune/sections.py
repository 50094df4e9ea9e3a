"""The run's options in the sections its stages take whole, built once per run (``sections``).

``RunOptions`` defines each option and its default; a section holds what one stage reads of
them: the search's (its space, its budget, the run it ranks for), the measurement's (a trial's
windows and limits, the emitted script's profile), verification's (its candidates and its
stages) and a shared study's. An option two stages read is in both their sections: --timeout
(the search's share, verification's fit), --exact and --fix (the space, and what the document
says of precision and the batch), --batch-range (the ramp, and how the batch was chosen).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from autotune.config import KnobValue
from autotune.document.options import options_record
from autotune.options import RunOptions
from autotune.runtime.json_value import JsonObject
from autotune.task import Task
from autotune.task.objective import PlannedRun


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """What the search is asked: its space (``fixed``, ``exact``, ``max_quality_drop``,
    ``scale_lr``, ``batch_range``), what a rank may hold (``memory_limit_mb``; None: the
    machine's share), its budget (``trials``; ``timeout_s``, the whole run's --timeout, of which
    it has its share), and the run it ranks for (``plan``; None: steady throughput)."""

    trials: int
    timeout_s: float | None
    fixed: Mapping[str, KnobValue]
    exact: bool
    max_quality_drop: float | None
    scale_lr: str
    batch_range: tuple[int, int] | None
    memory_limit_mb: float | None
    plan: PlannedRun | None

    @classmethod
    def of(cls, options: RunOptions, *, task: Task) -> SearchOptions:
        """Raises UsageError where the planned run cannot be (--epochs of a data set without a length)."""
        return cls(trials=options.trials, timeout_s=options.timeout_s, fixed=options.fixed, exact=options.exact,
                   max_quality_drop=options.max_quality_drop, scale_lr=options.scale_lr,
                   batch_range=options.batch_range, memory_limit_mb=options.memory_limit_mb,
                   plan=PlannedRun.of(train_steps=options.train_steps, epochs=options.epochs,
                                batch_size=task.batch_size, dataset_len=task.dataset_len))


@dataclasses.dataclass(frozen=True)
class MeasureOptions:
    """How a trial measures (``windows`` of ``window_s``, within ``trial_timeout_s``, hung
    after ``hang_timeout_s`` without progress; ``warm``: configurations that share a process
    measured in one), and whether the emitted script is profiled once (``profile``)."""

    window_s: float
    windows: int
    trial_timeout_s: float
    hang_timeout_s: float
    warm: bool
    profile: bool

    @classmethod
    def of(cls, options: RunOptions) -> MeasureOptions:
        return cls(window_s=options.window_s, windows=options.windows, trial_timeout_s=options.trial_timeout_s,
                   hang_timeout_s=options.hang_timeout_s, warm=options.warm_trials, profile=options.profile)

    @property
    def shortest_run_s(self) -> float:
        """The least timed training a standalone run may be cut to: a trial's measured windows."""
        return self.window_s * self.windows


@dataclasses.dataclass(frozen=True)
class VerifyOptions:
    """What verification is asked: the ``top`` candidates by search value (and those it adds),
    at most ``rounds`` side by side and ``pairs`` standalone pairs of ``pair_seconds`` each,
    the reduced precisions' ``max_quality_drop``, the knobs' ``path`` or not, fitted to
    ``timeout_s`` (the run's --timeout); ``exact``, ``batch_range`` and ``fixed`` for what the
    document says of precision and of the batch. What the run learns on the way (the planned
    run's prices, the room on the GPUs) verification adds itself (``verify.settings``)."""

    top: int
    rounds: int
    pairs: int
    pair_seconds: float
    max_quality_drop: float | None
    path: bool
    timeout_s: float | None
    exact: bool
    batch_range: tuple[int, int] | None
    fixed: Mapping[str, KnobValue]

    @classmethod
    def of(cls, options: RunOptions) -> VerifyOptions:
        return cls(top=options.top, rounds=options.rounds, pairs=options.pairs, pair_seconds=options.pair_seconds,
                   max_quality_drop=options.max_quality_drop, path=options.path, timeout_s=options.timeout_s,
                   exact=options.exact, batch_range=options.batch_range, fixed=options.fixed)

    @property
    def pinned_batch(self) -> int | None:
        """The batch size --fix pins; None where the search chose it."""
        batch = self.fixed.get("batch_size")
        return batch if isinstance(batch, int) else None


@dataclasses.dataclass(frozen=True)
class SharingOptions:
    """A study shared by several workers: its database (``storage``, a secret: never shown,
    see ``search.study.shown_url``; None: a journal in the output folder), its ``study``
    name, how often a running trial says it is alive, how long a worker waits for another
    one's verification."""

    storage: str | None = dataclasses.field(repr=False)
    study: str | None
    heartbeat_s: int
    verify_wait_s: float

    @classmethod
    def of(cls, options: RunOptions) -> SharingOptions:
        return cls(storage=options.storage, study=options.study, heartbeat_s=options.heartbeat_s,
                   verify_wait_s=options.verify_wait_s)

    @property
    def shared(self) -> bool:
        return self.storage is not None


@dataclasses.dataclass(frozen=True)
class Sections:
    search: SearchOptions
    measure: MeasureOptions
    verify: VerifyOptions
    sharing: SharingOptions
    # every option as best_config.json records it (secrets left out)
    record: JsonObject


def sections(options: RunOptions, *, task: Task) -> Sections:
    """``options`` in their sections, for ``task``; raises UsageError where the planned run
    cannot be (``PlannedRun.of``)."""
    return Sections(search=SearchOptions.of(options, task=task), measure=MeasureOptions.of(options),
                    verify=VerifyOptions.of(options), sharing=SharingOptions.of(options),
                    record=options_record(options))
