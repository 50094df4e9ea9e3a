"""The search steered by where the step goes: once the start has been measured, the leader
runs once more under torch.profiler (``TrialRunner.run(profile=True)``: about a second of
steps after its warm-up, outside every timed window, costing no trial of the budget), and
what its profile says (``search.steer``) is queued ahead of the sampler. Once those trials
have run, a new leader is profiled in turn, up to ``ROUNDS`` times.

What each round profiled, its shares, and what it queued are stored with the study
(``StudyAttr.STEERING``), each steered trial carries its reason (``StudyAttr.STEER``):
best_config.json and the report say which profile led to which trial, and what it found
(``found``, ``document.steering``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import optuna
from optuna.trial import TrialState

from autotune.config import TrialConfig
from autotune.document.steering import SteeredTrial, Steering, SteeringRound
from autotune.runtime.json_value import JsonValue
from autotune.runtime.step_profile import StepProfile
from autotune.schemas.typed import Record
from autotune.search.ledger import Ledger
from autotune.search.pruner import config_of
from autotune.search.steer import steer
from autotune.trials.protocol import Role, StudyAttr
from autotune.trials.runner import TrialRunnerLike

# Rounds of profiling: the first leader's, then the leader its trials found, if another.
ROUNDS = 2
# Trials one profile queues at most: the likeliest of its proposals, the sampler keeps the rest.
MOST = 3
# The roles of the start: steering waits until they have all run.
_START = (Role.BASELINE, Role.HEURISTIC, Role.PRECISION)


@dataclasses.dataclass(frozen=True)
class Round(Record):
    """One profile: of ``config`` (short form), its shares (None where the profiled run
    failed: ``failed`` says why), and the trials it queued: each a dict of ``config``,
    ``category``, ``share``, ``why``."""

    config: str
    profile: StepProfile | None
    queued: tuple[Mapping[str, JsonValue], ...] = ()
    failed: str | None = None


def rounds_of(study: optuna.Study) -> list[Round]:
    return [Round.from_json(r) for r in study.user_attrs.get(StudyAttr.STEERING) or []]


def _due(study: optuna.Study, ledger: Ledger) -> TrialConfig | None:
    """The leader to profile now, or None: not while a trial waits in the queue or the
    start or a round's trials have not all run; not once ``ROUNDS`` rounds ran, nor where
    the last round profiled the leader as it is."""
    done = rounds_of(study)
    if len(done) >= ROUNDS:
        return None
    trials = study.get_trials(deepcopy=False)
    if any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in trials):
        return None
    if not any(t.user_attrs.get(StudyAttr.ROLE) in _START for t in trials):
        return None  # a study from before the start was queued
    leader = ledger.best_config()
    if leader is None or (done and done[-1].config == leader.short()):
        return None
    if done and not done[-1].queued:
        return None  # the last profile found nothing to try: the next would say the same
    return leader


def steer_once(study: optuna.Study, ledger: Ledger, runner: TrialRunnerLike, *, room: int) -> Round | None:
    """Profile the leader where a round is due (``_due``) and queue what its profile says,
    at most ``room`` trials (what the budget has left: a trial queued past it would wait in
    the study after the search ended); returns the round (None where none was due). The
    caller holds the study's lock."""
    leader = _due(study, ledger)
    if leader is None:
        return None
    number = len(study.get_trials(deepcopy=False))
    result = runner.run(leader, name=f"profile-{number:04d}", profile=True)
    profile = result.step_profile
    if profile is None:
        taken = Round(config=leader.short(), profile=None,
                      failed=result.describe_failure() if result.failure else "the profiled run reported no profile")
    else:
        tried = [c for t in study.get_trials(deepcopy=False) if (c := config_of(t)) is not None]
        picked = [s for s in steer(profile, leader, space=ledger.space, tried=tried)
                  if ledger.memory_bound(s.config) is None][:max(0, min(MOST, room))]
        for s in picked:
            study.enqueue_trial(ledger.space.params_of(s.config), user_attrs={
                StudyAttr.ROLE: Role.STEERED,
                StudyAttr.STEER: {"category": s.category.value, "share": s.share, "why": s.why,
                                  "profiled": leader.short()}})
        taken = Round(config=leader.short(), profile=profile, queued=tuple(
            {"config": s.config.short(), "category": s.category.value, "share": s.share, "why": s.why}
            for s in picked))
    study.set_user_attr(StudyAttr.STEERING, [*(r.to_json() for r in rounds_of(study)), taken.to_json()])
    return taken


def found(study: optuna.Study) -> Steering | None:
    """Each round with what its steered trials measured, in the order they ran; None where
    the search profiled nothing."""
    done = rounds_of(study)
    if not done:
        return None
    trials = study.get_trials(deepcopy=False)
    rates: dict[str, float] = {}
    for t in trials:
        if t.state == TrialState.COMPLETE and t.value is not None and (c := config_of(t)) is not None:
            rates[c.short()] = max(rates.get(c.short(), 0.0), float(t.value))
    out = []
    for r in done:
        mine = []
        for t in trials:
            steer_attr = t.user_attrs.get(StudyAttr.STEER) or {}
            if t.user_attrs.get(StudyAttr.ROLE) != Role.STEERED or steer_attr.get("profiled") != r.config:
                continue
            cfg = config_of(t)
            value = float(t.value) if t.state == TrialState.COMPLETE and t.value is not None else None
            outcome = ("measured" if value is not None else str(t.user_attrs.get(StudyAttr.SKIPPED)
                       or t.user_attrs.get(StudyAttr.FAILURE) or t.state.name.lower()))
            mine.append(SteeredTrial(config=cfg.short() if cfg else "", category=str(steer_attr.get("category")),
                                     why=str(steer_attr.get("why")), samples_per_s=value, outcome=outcome))
        out.append(SteeringRound(config=r.config, samples_per_s=rates.get(r.config), profile=r.profile,
                                 failed=r.failed, trials=tuple(mine)))
    return Steering(tuple(out))
