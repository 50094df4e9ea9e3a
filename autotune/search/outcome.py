"""What the search found: its ranking, the baseline it is compared with, what failed, and
what the trials say about memory; read from the study's trials (``outcome_of``)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import optuna
from optuna.trial import TrialState

from autotune.config import TrialConfig
from autotune.document.run import SearchFailure
from autotune.search.ledger import Ledger
from autotune.search.memory import MemoryLimit, known_to_fit
from autotune.search.pruner import config_of
from autotune.search.trial_summary import TrialSummary
from autotune.task.objective import Measured
from autotune.trials.protocol import Failure, Role, StudyAttr


@dataclasses.dataclass
class Candidate:
    number: int
    config: TrialConfig
    value: float  # what the search ranks by: throughput, or under a plan the effective one
    result: TrialSummary  # its trial's, as the study stores it

    @property
    def measured(self) -> Measured:
        """Its steady rate (the median window) and one-time cost, as the trial measured them."""
        return Measured(config=self.config, samples_per_s=float(self.result.value or self.value),
                        one_time_s=self.result.one_time_s)


@dataclasses.dataclass
class SearchOutcome:
    study: optuna.Study
    baseline: Candidate | None
    ranked: list[Candidate]  # completed, measured trials, fastest first, one per config
    failures: list[SearchFailure]
    measured: int = 0  # trials that cost a measurement
    # the user's own configuration's trial summary: ``baseline`` is it, or, where it ran out
    # of memory or over the limit, it holding less (search.memory.rescue)
    user_result: TrialSummary = TrialSummary()
    # the user's configuration and each step of its ladder measured (search.memory.ladder),
    # with their trials' summaries
    reference_tried: list[tuple[TrialConfig, TrialSummary]] = dataclasses.field(default_factory=list)

    def results(self) -> list[tuple[TrialConfig, TrialSummary]]:
        """Each ranked configuration with its trial's summary."""
        return [(c.config, c.result) for c in self.ranked]

    def failed(self) -> list[tuple[TrialConfig, str | None, str]]:
        """Each failed configuration, how it failed, and why."""
        return [(f.config, f.failure, f.message) for f in self.failures]

    def fits(self, limit: MemoryLimit) -> Callable[[TrialConfig], bool]:
        """Whether a configuration is known to fit in memory, from the search's trials
        (``memory.known_to_fit``)."""
        return known_to_fit(limit, measured=self.results(), failed=self.failed())


def outcome_of(ledger: Ledger) -> SearchOutcome:
    """The search's outcome so far, from its study's trials as ``ledger`` reads them."""
    study = ledger.study
    trials = study.get_trials(deepcopy=False)
    baseline = None
    user_result = TrialSummary()
    reference_tried: list[tuple[TrialConfig, TrialSummary]] = []
    ranked: dict[str, Candidate] = {}
    failures = []
    stale = ledger.stale()
    for t in trials:
        cfg = config_of(t)
        if cfg is None or t.user_attrs.get(StudyAttr.DUPLICATE_OF) is not None:
            continue
        stored = t.user_attrs.get(StudyAttr.RESULT) or {}
        summary = TrialSummary.from_json(stored)
        if t.user_attrs.get(StudyAttr.ROLE) == Role.BASELINE and cfg == ledger.space.baseline:
            user_result = summary if stored else user_result
        if t.user_attrs.get(StudyAttr.ROLE) == Role.BASELINE and t.state in (TrialState.COMPLETE,
                                                                              TrialState.FAIL):
            reference_tried.append((cfg, summary))
        if t.state == TrialState.COMPLETE:
            cand = Candidate(t.number, cfg, float(t.value or 0.0), summary)
            if t.user_attrs.get(StudyAttr.ROLE) == Role.BASELINE:
                baseline = cand
            key = str(cfg)
            if key not in ranked or ranked[key].value < cand.value:
                ranked[key] = cand
        elif t.state == TrialState.FAIL:
            failures.append(SearchFailure(
                number=t.number, config=cfg,
                failure=(Failure.INTERRUPTED if ledger.interrupted(t, stale)
                         else t.user_attrs.get(StudyAttr.FAILURE)),
                message=t.user_attrs.get(StudyAttr.SKIPPED) or summary.message,
                log_tail=summary.log_tail))
    order = sorted(ranked.values(), key=lambda c: c.value, reverse=True)
    return SearchOutcome(study=study, baseline=baseline, ranked=order, failures=failures,
                         measured=len(ledger.measured(rungs=True)), user_result=user_result,
                         reference_tried=reference_tried)
