"""The search's pruner: a trial stops early only when it is clearly slower than the best
of its kind."""
from __future__ import annotations

import statistics

import optuna
from optuna.trial import TrialState

from autotune.config import TrialConfig
from autotune.trials.protocol import Role, StudyAttr


def config_of(t: optuna.trial.FrozenTrial) -> TrialConfig | None:
    """The configuration a trial measured, as the tuner stored it."""
    data = t.user_attrs.get(StudyAttr.CONFIG)
    return TrialConfig.from_dict(data) if data else None


class ClearlySlowerPruner(optuna.pruners.BasePruner):
    """Stop a trial whose windows so far are clearly below the best trial of its kind.

    Single windows on a shared machine vary by 20% or more, so only a wide gap
    prunes: the median of the reported windows under ``ratio`` x the best value. Under a
    planned run (``task.objective``) the best value is an effective throughput, and the
    windows are steady throughput, which no trial's effective throughput exceeds (its
    one-time cost only lowers it): a trial pruned is clearly slower still. Exact
    (fp32, unpruned) trials are compared with exact ones only: where bf16 runs twice as
    fast, every fp32 trial would otherwise be pruned, and the exact fallback that
    verification keeps beside a reduced-precision winner would never be measured.
    """

    def __init__(self, *, ratio: float = 0.6, min_windows: int = 2) -> None:
        self.ratio, self.min_windows = ratio, min_windows

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        if trial.user_attrs.get(StudyAttr.ROLE) == Role.BASELINE:
            return False
        values = list(trial.intermediate_values.values())
        if len(values) < self.min_windows:
            return False
        cfg = config_of(trial)
        best = max((t.value for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                    if t.value is not None
                    and (cfg is None or (c := config_of(t)) is None or c.exact == cfg.exact)),
                   default=None)
        return best is not None and statistics.median(values) < self.ratio * best
