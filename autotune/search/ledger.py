"""The study's trials as the search reads them: which cost a trial of the budget, which
are running, which a dead tuner left behind, whether a configuration was measured before,
what the trials say about memory, and the best configuration so far. Shared by the loop
(``search.tuner``) and what it queues (``search.queued``)."""
from __future__ import annotations

import optuna
from optuna.trial import TrialState

from autotune.config import TrialConfig
from autotune.search import memory
from autotune.search.pruner import config_of
from autotune.search.trial_summary import TrialSummary
from autotune.space import Space
from autotune.trials.protocol import Failure, Role, StudyAttr


def is_rung(trial: optuna.trial.FrozenTrial | optuna.Trial) -> bool:
    """Whether ``trial`` measures a step of the reference's ladder (``Tuner._next_rung``):
    the user's configuration holding less, which costs no trial of the budget."""
    return (trial.user_attrs.get(StudyAttr.ROLE) == Role.BASELINE
            and bool(trial.user_attrs.get(StudyAttr.BASELINE_CONFIG)))


def measured_trials(study: optuna.Study) -> list[tuple[TrialConfig, TrialSummary]]:
    """Every trial that measured something, with what it reported, pruned ones too: their
    first step's facts (the model's FLOPs, the peak of their ranks) are as good as any."""
    return [(c, TrialSummary.from_json(t.user_attrs[StudyAttr.RESULT])) for t in study.get_trials(deepcopy=False)
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED) and t.user_attrs.get(StudyAttr.RESULT)
            and (c := config_of(t)) is not None]


def baseline_config(trial: optuna.trial.FrozenTrial | optuna.Trial, space: Space) -> TrialConfig:
    """What a baseline-role trial measures (or would have): the user's configuration, or
    it holding less."""
    held_less = trial.user_attrs.get(StudyAttr.BASELINE_CONFIG)
    return TrialConfig.from_dict(held_less) if held_less else space.baseline


class Ledger:
    """``study``'s trials over ``space``; ``shared``: other workers use the study at the
    same time (their running trials count against the budget)."""

    def __init__(self, study: optuna.Study, space: Space, *, shared: bool = False) -> None:
        self.study, self.space, self.shared = study, space, shared

    def measured(self, *, rungs: bool = False) -> list[optuna.trial.FrozenTrial]:
        """Trials that cost a measurement of the budget (finished, not a duplicate, not
        skipped); with ``rungs``, the reference's ladder's too (``is_rung``), which costs none."""
        stale = self.stale()
        return [
            t for t in self.study.get_trials(deepcopy=False)
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
            and t.user_attrs.get(StudyAttr.DUPLICATE_OF) is None
            and not t.user_attrs.get(StudyAttr.SKIPPED)
            and not self.interrupted(t, stale)  # retried: costs no budget
            and (rungs or not is_rung(t))
        ]

    def running(self, *, rungs: bool = False) -> list[optuna.trial.FrozenTrial]:
        """Trials other workers of a shared study are measuring now, of the budget; with
        ``rungs``, steps of the reference's ladder too."""
        if not self.shared:
            return []
        return [t for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                if t.user_attrs.get(StudyAttr.DUPLICATE_OF) is None and not t.user_attrs.get(StudyAttr.SKIPPED)
                and (rungs or not is_rung(t))]

    def stale(self) -> set[int]:
        """Numbers of the trials whose tuner died while they ran."""
        attrs = self.study.user_attrs
        prefix = f"{StudyAttr.STALE_TRIAL}:"
        return ({int(k[len(prefix):]) for k in attrs if k.startswith(prefix)}
                | set(attrs.get(StudyAttr.STALE, [])))  # as studies of autotune 0.x recorded them

    def interrupted(self, t: optuna.trial.FrozenTrial, stale: set[int] | None = None) -> bool:
        return (t.user_attrs.get(StudyAttr.FAILURE) == Failure.INTERRUPTED
                or t.number in (self.stale() if stale is None else stale))

    def previous(self, cfg: TrialConfig) -> optuna.trial.FrozenTrial | None:
        stale = self.stale()
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL)):
            if (t.user_attrs.get(StudyAttr.DUPLICATE_OF) is None and config_of(t) == cfg
                    and not self.interrupted(t, stale)):
                return t
        return None

    def memory_bound(self, cfg: TrialConfig) -> str | None:
        """Why ``cfg`` will not fit, from the trials so far (``memory.bound``); None if nothing says so."""
        trials = self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.FAIL))
        return memory.bound(cfg, ran_out=[c for t in trials if (c := config_of(t)) and t.state == TrialState.FAIL
                                          and t.user_attrs.get(StudyAttr.FAILURE) == Failure.OUT_OF_MEMORY],
                            measured=[(c, TrialSummary.from_json(t.user_attrs.get(StudyAttr.RESULT, {})))
                                      for t in trials if (c := config_of(t)) and t.state == TrialState.COMPLETE])

    def best_config(self, *, several_ranks: bool | None = None,
                     exact: bool | None = None) -> TrialConfig | None:
        """The best configuration so far (of one process kind, when ``several_ranks`` is
        given; exact or reduced-precision, when ``exact`` is), as params of the space
        can select it."""
        done = sorted(
            (t for t in self.study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
             if t.user_attrs.get(StudyAttr.DUPLICATE_OF) is None and t.value is not None),
            key=lambda t: t.value or 0.0, reverse=True)
        for best in done:
            cfg = config_of(best)
            if cfg is None:
                continue
            if several_ranks is not None and (cfg.nprocs > 1) != several_ranks:
                continue
            if exact is not None and cfg.exact != exact:
                continue
            for candidate in (cfg, cfg.replace(threads=int(
                    best.user_attrs.get(StudyAttr.RESULT, {}).get("threads_seen") or 1))):
                try:  # the baseline's default threads are outside the sampled space
                    self.space.params_of(candidate)
                    return candidate
                except ValueError:
                    continue
            return None  # its layout is not searched at all (--fix threads/nprocs)
        return None
