"""The search steered by where the step goes: once the start has been measured, the leader
runs once more under torch.profiler (``TrialRunner.run(profile=True)``: about a second of
steps after its warm-up, outside every timed window, costing no trial of the budget), and
what its profile says (``search.steer``) is queued ahead of the sampler. Once those trials
have run, a new leader is profiled in turn, up to ``ROUNDS`` times.

What each round profiled, its shares, and what it queued are stored with the study
(``StudyAttr.STEERING``), each steered trial carries its reason (``StudyAttr.STEER``):
best_config.json and the report say which profile led to which trial, and what it found
(``found``, ``document.steering``).

A change that lost for one leader (its trial pruned, failed, or measured under ``LOST`` of
that leader) is not queued again for the next unless the new leader's profile gives its
category ``MARGIN`` more of the step: compile losing on a CPU loses again one batch up, and
its trials are better spent on what the search has not measured near the leader
(``steer.unmeasured``: a layout no trial ran, the leader's batch one step away). The round
records each change it left out and why.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import optuna
from optuna.trial import TrialState

from autotune.config import TrialConfig
from autotune.document.steering import SteeredTrial, Steering, SteeringRound
from autotune.runtime.json_value import JsonValue
from autotune.runtime.shares import Category
from autotune.runtime.step_profile import StepProfile
from autotune.schemas.typed import Omitted, OmittedEmpty, Record
from autotune.search.ledger import Ledger
from autotune.search.pruner import config_of
from autotune.search.steer import change, steer, unmeasured
from autotune.trials.protocol import Role, StudyAttr
from autotune.trials.runner import TrialRunnerLike

# Rounds of profiling: the first leader's, then the leader its trials found, if another.
ROUNDS = 2
# Trials one profile queues at most: the likeliest of its proposals, the sampler keeps the rest.
MOST = 3
# The roles of the start: steering waits until they have all run.
_START = (Role.BASELINE, Role.HEURISTIC, Role.PRECISION)
# A steered trial lost where it measured under this share of the leader it was derived from
# (or was pruned, or failed) ...
LOST = 0.95
# ... and its change is tried again for a later leader only where that one's profile gives
# the change's category this much more of the step (an absolute share).
MARGIN = 0.10
# What a trial queued for what the search has not measured is filed under (``queued``).
UNMEASURED = "unmeasured"


@dataclasses.dataclass(frozen=True)
class Round(Record):
    """One profile: of ``config`` (short form), its shares (None where the profiled run
    failed: ``failed`` says why), and the trials it queued: each a dict of ``config``,
    ``category``, ``share``, ``why``."""

    config: str
    profile: StepProfile | None
    queued: tuple[Mapping[str, JsonValue], ...] = ()
    failed: str | None = None
    samples_per_s: Omitted[float] = None  # the leader's rate when profiled
    # changes left out as lost for an earlier leader: each a dict of ``config``, ``category``, ``why``
    skipped: OmittedEmpty[tuple[Mapping[str, JsonValue], ...]] = ()


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
    rate = max((float(t.value) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                if t.value is not None and t.user_attrs.get(StudyAttr.DUPLICATE_OF) is None), default=None)
    result = runner.run(leader, name=f"profile-{number:04d}", profile=True)
    profile = result.step_profile
    if profile is None:
        taken = Round(config=leader.short(), profile=None, samples_per_s=rate,
                      failed=result.describe_failure() if result.failure else "the profiled run reported no profile")
    else:
        tried = [c for t in study.get_trials(deepcopy=False) if (c := config_of(t)) is not None]
        proposed = [s for s in steer(profile, leader, space=ledger.space, tried=tried)
                    if ledger.memory_bound(s.config) is None]
        lost = _lost(study)
        fresh, skipped = [], []
        for s in proposed:
            what = change(ledger.space, leader, s.config)
            before = next((lo for lo in lost if lo.change == what
                           and profile.share(s.category) < lo.share + MARGIN), None)
            if before is None:
                fresh.append((s.config, s.category.value, s.share, s.why, what))
            else:
                now = profile.share(s.category)
                skipped.append({"config": s.config.short(), "category": s.category.value,
                                "why": f"{_said(what)} {before.how} for {before.leader} ({s.category.value} "
                                       f"{before.share:.0%} of its step, {now:.0%} of this one's)"})
        most = max(0, min(MOST, room))
        picked = fresh[:most]
        if skipped:  # the trials saved go to what the search has not measured near the leader
            for cfg, why in unmeasured(leader, space=ledger.space, tried=tried)[:min(len(skipped), most - len(picked))]:
                if ledger.memory_bound(cfg) is None:
                    picked.append((cfg, UNMEASURED, 0.0, why, change(ledger.space, leader, cfg)))
        for cfg, category, share, why, what in picked:
            study.enqueue_trial(ledger.space.params_of(cfg), user_attrs={
                StudyAttr.ROLE: Role.STEERED,
                StudyAttr.STEER: {"category": category, "share": share, "why": why,
                                  "profiled": leader.short(), "change": what}})
        taken = Round(config=leader.short(), profile=profile, samples_per_s=rate, queued=tuple(
            {"config": cfg.short(), "category": category, "share": share, "why": why}
            for cfg, category, share, why, _ in picked), skipped=tuple(skipped))
    study.set_user_attr(StudyAttr.STEERING, [*(r.to_json() for r in rounds_of(study)), taken.to_json()])
    return taken


@dataclasses.dataclass(frozen=True)
class _Lost:
    """A steered change that lost for ``leader`` (short form): ``how``; its category's
    ``share`` of that leader's step."""

    change: Mapping[str, JsonValue]
    leader: str
    how: str
    share: float


def _said(what: Mapping[str, JsonValue]) -> str:
    return " ".join(f"{k}={v}" for k, v in what.items())


def _rates(trials: list[optuna.trial.FrozenTrial]) -> dict[str, float]:
    """Each configuration's best measured rate, by its short form."""
    rates: dict[str, float] = {}
    for t in trials:
        if t.state == TrialState.COMPLETE and t.value is not None and (c := config_of(t)) is not None:
            rates[c.short()] = max(rates.get(c.short(), 0.0), float(t.value))
    return rates


def _lost(study: optuna.Study) -> list[_Lost]:
    """The steered trials of earlier rounds that lost against the leader they came from."""
    rounds = {r.config: r for r in rounds_of(study) if r.profile is not None}
    trials = study.get_trials(deepcopy=False)
    rates = _rates(trials)
    out = []
    for t in trials:
        attr = t.user_attrs.get(StudyAttr.STEER) or {}
        r = rounds.get(str(attr.get("profiled")))
        if t.user_attrs.get(StudyAttr.ROLE) != Role.STEERED or r is None or attr.get("change") is None:
            continue
        if attr.get("category") not in {c.value for c in Category}:
            continue  # queued for what was not measured: nothing the profile asked for
        base = r.samples_per_s or rates.get(r.config)
        if t.state == TrialState.PRUNED:
            how = "was pruned"
        elif t.state == TrialState.FAIL:
            how = "failed"
        elif t.state == TrialState.COMPLETE and t.value is not None and base and t.value < LOST * base:
            how = f"measured {t.value / base:.2f}x"
        else:
            continue
        assert r.profile is not None
        out.append(_Lost(change=attr["change"], leader=r.config, how=how,
                         share=r.profile.share(Category(attr["category"]))))
    return out


def found(study: optuna.Study) -> Steering | None:
    """Each round with what its steered trials measured, in the order they ran; None where
    the search profiled nothing."""
    done = rounds_of(study)
    if not done:
        return None
    trials = study.get_trials(deepcopy=False)
    rates = _rates(trials)
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
        out.append(SteeringRound(config=r.config, samples_per_s=r.samples_per_s or rates.get(r.config),
                                 profile=r.profile,
                                 failed=r.failed, trials=tuple(mine),
                                 skipped=tuple(str(k['why']) for k in r.skipped)))
    return Steering(tuple(out))
