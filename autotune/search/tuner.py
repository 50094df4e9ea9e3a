"""The search policy: which configurations to measure, in which order, within the budget.

The study is stored by ``autotune.search.study`` (one per model file and machine, resumed by
running the same command again). Trials are run with Optuna's ask-and-tell interface:
each one is measured in its own process tree by ``autotune.trials.runner``. The start, the
trials the leader's step profile asks for (``search.steering``), the refinements at the end
(``search.queued``) and TPE's samples are told apart by the trial's ``StudyAttr.ROLE``.
"""
from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import optuna
from optuna.trial import TrialState

from autotune.config import TrialConfig
from autotune.errors import UsageError
from autotune.runtime.knobs import CompileMode, Device
from autotune.search import late, memory, steering
from autotune.search.course import Course
from autotune.search.ledger import Ledger, baseline_config, is_rung
from autotune.search.outcome import SearchOutcome, outcome_of
from autotune.search.pruner import ClearlySlowerPruner, config_of
from autotune.search.queued import Stages
from autotune.search.study import create_or_resume, quiet_optuna
from autotune.space import Space, Unsplittable
from autotune.task.objective import described
from autotune.trials.progress import BudgetStop, Progress, StaleTrial, TrialEnd, TrialStart, TrialWindow, no_progress
from autotune.trials.protocol import Failure, ProgressEvent, Role, Status, StudyAttr
from autotune.trials.runner import TrialResult, TrialRunnerLike


def open_study(*, storage_path: Path | None = None, storage: optuna.storages.BaseStorage | None = None,
               study_name: str, seed: int = 0,
               sampler: optuna.samplers.BaseSampler | None = None) -> optuna.Study:
    """The search's study (``autotune.search.study`` stores it: a journal at ``storage_path``,
    or ``storage``), with the search's sampler and pruner: a resumed study gets a fresh
    sampler, seeded the same."""
    # group=True: late knobs make the sampled parameter set differ between trials.
    with warnings.catch_warnings():  # group is "experimental" in Optuna 5, and what we need
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = sampler or optuna.samplers.TPESampler(seed=seed, multivariate=True, group=True,
                                                        n_startup_trials=6)
    where = storage if storage is not None else storage_path
    assert where is not None, "a study is stored somewhere"
    return create_or_resume(storage=where, study_name=study_name, sampler=sampler,
                            pruner=ClearlySlowerPruner())


def retry_stale(study: optuna.Study, trial: optuna.trial.FrozenTrial) -> None:
    """``trial`` was left running by a tuner that died (killed; in a shared study, its
    heartbeat stopped) and is failed now: it costs no budget, and it is measured again,
    once. Optuna cannot annotate a finished trial: the study records it, one key per
    trial (workers of a shared study may record at once). A step of the reference's ladder
    (``Tuner._next_rung``) is not queued: the ladder takes it again, ahead of the queue."""
    study.set_user_attr(f"{StudyAttr.STALE_TRIAL}:{trial.number}", True)
    if not trial.user_attrs.get(StudyAttr.RETRY) and not is_rung(trial):
        study.enqueue_trial(
            trial.params, user_attrs={StudyAttr.ROLE: trial.user_attrs.get(StudyAttr.ROLE), StudyAttr.RETRY: True},
            skip_if_exists=False)


@contextlib.contextmanager
def _heartbeat(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """The trial's heartbeat while this tuner works on it, where the storage keeps them (a
    shared study): Optuna records it only inside ``Study.optimize``, and the search uses
    ask-and-tell (each trial is measured in another process)."""
    from optuna.storages._heartbeat import get_heartbeat_thread

    with get_heartbeat_thread(trial._trial_id, study._storage):
        yield


class Tuner:
    POLL_S = 1.0  # how often a worker looks whether other workers' trials have ended

    def __init__(self, *, study: optuna.Study, space: Space, runner: TrialRunnerLike, course: Course,
                 progress: Progress = no_progress) -> None:
        """Measures ``space``'s configurations with ``runner`` on ``study`` as ``course``
        says: until its budget is spent, from its starts, ranking them as its scoring values
        them, taking turns with the study's other workers."""
        self.study, self.space, self.runner, self.progress = study, space, runner, progress
        self.budget, self.scoring, self.turns = course.budget, course.scoring, course.turns
        self.steers = course.steers
        self.ledger = Ledger(study, space, shared=course.turns.shared)
        self.stages = Stages(self.ledger, trials=course.budget.trials, heuristics=course.starts.heuristics,
                             fastest_batch=course.starts.fastest_batch)

    def _recover_stale(self) -> None:
        """Trials left RUNNING by a killed tuner are failed and retried once. In a shared
        study another worker's running trial is its own: there the heartbeat tells a dead
        worker's trials (``study.database_storage``), failed by whichever worker looks."""
        if self.turns.shared:
            with warnings.catch_warnings():  # fail_stale_trials is "experimental" in Optuna 5
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                before = {t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
                optuna.storages.fail_stale_trials(self.study)
            now = {t.number for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
            for number in sorted(before - now):
                if number in self.ledger.stale():
                    self.progress(ProgressEvent.STALE, StaleTrial(number))
            return
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            self.study.tell(t.number, state=TrialState.FAIL)
            retry_stale(self.study, t)
            self.progress(ProgressEvent.STALE, StaleTrial(t.number))

    def _next_rung(self) -> optuna.Trial | None:
        """The next step of the reference's ladder, started for this worker to measure, or
        None. Where the user's configuration ran out of memory or over the limit, the search
        needs it holding less to compare with before it spends its budget: each step of
        ``memory.ladder`` after the last one that ran out, one at a time, until one fits or
        none is left. Its trials (baseline-role, ``BASELINE_CONFIG`` the step) cost no
        trial of --trials, and are started here, RUNNING, not queued: the queue holds the
        starts ahead of them. None while a baseline-role trial is queued or running
        (another worker's step, whose result decides the next), once one fitted, once the
        last step measured failed otherwise (or was skipped), or no step is left.

        Decided under the study's lock: in a shared study one worker takes each step."""
        def pending() -> list[TrialConfig] | None:
            trials = [t for t in self.study.get_trials(deepcopy=False)
                      if t.user_attrs.get(StudyAttr.ROLE) == Role.BASELINE
                      and t.user_attrs.get(StudyAttr.DUPLICATE_OF) is None]
            if any(t.state != TrialState.FAIL for t in trials):  # fitted, queued or running
                return None
            stale = self.ledger.stale()
            failures = {baseline_config(t, self.space): t.user_attrs.get(StudyAttr.FAILURE)
                        for t in trials if not self.ledger.interrupted(t, stale)}
            steps = memory.ladder(self.space.baseline, self.space)
            reached = [i for i, cfg in enumerate(steps) if cfg in failures]
            if not reached or failures[steps[reached[-1]]] != Failure.OUT_OF_MEMORY:
                return None
            return steps[reached[-1] + 1:] or None

        if pending() is None:  # most of the time: asked without the lock
            return None
        with self.turns.lock():
            left = pending()
            if left is None:
                return None
            template = optuna.trial.create_trial(
                state=TrialState.RUNNING,
                user_attrs={StudyAttr.ROLE: Role.BASELINE, StudyAttr.BASELINE_CONFIG: left[0].to_dict()})
            # as Study.ask creates a trial, but for this step, ahead of the queue
            trial_id = self.study._storage.create_new_trial(self.study._study_id, template_trial=template)
        return optuna.Trial(self.study, trial_id)

    def _compile_ahead(self) -> optuna.Trial | None:
        """Under --timeout, the late stage's first compile on the best on a GPU
        (``Stages.compile_ahead``), started for this worker to measure ahead of the queue,
        where the whole run still holds it: its compile priced against what is left once
        verification at its least is kept, the compile's cached reads included
        (``late.too_late``). Only once the user's configuration was measured: before that,
        verification cannot be priced. Decided under the study's lock: in a shared study one
        worker takes it."""
        # most of the time (on a CPU, once compiled) decided without the lock or the outcome
        if self.budget.room_s is None or self.stages.compile_ahead() is None or self.outcome().baseline is None:
            return None
        with self.turns.lock():
            params = self.stages.compile_ahead()
            if params is None:
                return None
            cfg = self.space.config_from_params(params)
            trials = self.study.get_trials(deepcopy=False)
            left_s = self.budget.room_left_s(self.outcome, once_s=late.compile_estimate_s(trials, cfg))
            if left_s is None or late.too_late(trials, cfg, left_s=left_s) is not None:
                return None
            # as Study.ask creates a trial of queued params, but ahead of the queue
            template = optuna.trial.create_trial(state=TrialState.RUNNING, system_attrs={"fixed_params": params},
                                                 user_attrs={StudyAttr.ROLE: Role.LATE})
            trial_id = self.study._storage.create_new_trial(self.study._study_id, template_trial=template)
        return optuna.Trial(self.study, trial_id)

    # --- the loop ------------------------------------------------------------------

    def run(self) -> SearchOutcome:
        with quiet_optuna():
            return self._run()

    def _run(self) -> SearchOutcome:
        with self.turns.lock():
            self._settle_plan()
            self._recover_stale()
            self.stages.enqueue_start()
        asks_left = 5 * self.budget.trials + 10  # duplicates and skips cost no measurement
        stop: str | None = None
        while True:
            if self.turns.shared:
                self._recover_stale()
            measured = self.ledger.measured()
            stop = stop or self._stop_reason(measured)
            # The reference is measured whatever the budget says: without it nothing the
            # search found could be compared, and a run that used its time before the first
            # trial (a slow probe under a short --timeout) would end with nothing
            if (rung := self._next_rung()) is not None:
                with _heartbeat(self.study, rung):
                    self._measure(rung)
                continue
            if stop is not None and self._user_config_queued():
                self._one_trial()  # the queue's head: the baseline, enqueued first
                continue
            if (stop is None and len(measured) + len(self.ledger.running()) < self.budget.trials
                    and (ahead := self._compile_ahead()) is not None):
                with _heartbeat(self.study, ahead):
                    self._measure(ahead)
                continue
            if stop is None and asks_left > 0 and len(measured) + len(self.ledger.running()) < self.budget.trials:
                with self.turns.lock():
                    room = self.budget.trials - len(self.ledger.measured()) - len(self.ledger.running())
                    steered = None
                    if room > 0 and self.steers:
                        with self.turns.measuring():  # the profiled run is alone on the machine
                            steered = steering.steer_once(self.study, self.ledger, self.runner, room=room)
                    # asked under the lock, the budget looked at again: another worker may
                    # have started a trial while this one waited for the lock or profiled
                    trial = None
                    if steered is None and (len(self.ledger.measured()) + len(self.ledger.running())
                                            < self.budget.trials):
                        self.stages.enqueue_refinements()
                        trial = self._ask()
                if trial is not None:
                    asks_left -= 1
                    with _heartbeat(self.study, trial):
                        self._measure(trial)
                continue
            if self.ledger.running(rungs=True):
                # another worker's trial still measures: its result belongs to the ranking
                # that verification starts from (and if its worker died, its retry is ours)
                time.sleep(self.POLL_S)
                continue
            break
        if stop is not None:
            self.progress(ProgressEvent.BUDGET, BudgetStop(stop))
        return self.outcome()

    def _user_config_queued(self) -> bool:
        """Whether the user's configuration waits in the queue, not yet started."""
        return any(t.state == TrialState.WAITING and t.user_attrs.get(StudyAttr.ROLE) == Role.BASELINE
                   for t in self.study.get_trials(deepcopy=False))

    def _settle_plan(self) -> None:
        """The plan the study's values are for, stored on it when new. A study resumed with
        another plan is refused: its values would mix two objectives, and Optuna cannot
        re-value finished trials. A study stored without a plan (or by an autotune before
        plans) holds steady throughputs."""
        plan = self.scoring.plan
        mine = plan.to_json() if plan is not None else None
        attrs = self.study.user_attrs
        if StudyAttr.PLAN in attrs:
            stored = attrs[StudyAttr.PLAN]
        elif self.study.get_trials(deepcopy=False):
            stored = None
        else:
            self.study.set_user_attr(StudyAttr.PLAN, mine)
            return
        if (stored or {}).get("samples") == (mine or {}).get("samples"):
            return
        raise UsageError(
            f"the study {self.study.study_name!r} ranked its trials for {described(stored)}; this run "
            f"asks for {described(mine)}. Its trials' values cannot be re-ranked in place: run "
            "with the plan it was made for, or tune into another --out (or, for a shared study, "
            "another --study) for this plan")

    def _stop_reason(self, measured: list[optuna.trial.FrozenTrial]) -> str | None:
        """Why no new trial starts, though the budget of trials is not spent; None if one may."""
        if why := self.budget.spent(self.outcome):
            return why
        if len({str(config_of(t)) for t in measured}) >= self.space.grid_size:
            return "every configuration of the space was measured"
        return None

    def _ask(self) -> optuna.Trial:
        with warnings.catch_warnings():
            # Optuna asks for Study.optimize where the storage keeps heartbeats; _heartbeat
            # records them instead
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            return self.study.ask()

    def _one_trial(self) -> None:
        trial = self._ask()
        with _heartbeat(self.study, trial):
            self._measure(trial)

    def _measure(self, trial: optuna.Trial) -> None:
        role = trial.user_attrs.get(StudyAttr.ROLE)
        try:
            if role == Role.BASELINE:
                cfg = baseline_config(trial, self.space)
            else:  # as it can run: where the trials so far say it will not fit, holding less
                # an enqueued trial's params hold its memory knobs (a refinement of a
                # configuration holding less keeps them); a sampled one's do not
                cfg = self._held_to_fit(self.space.suggest(trial, late=role in (Role.LATE, Role.STEERED),
                                                           memory=role is not None))
        except Unsplittable as exc:  # costs no measurement, like a duplicate
            trial.set_user_attr(StudyAttr.SKIPPED, str(exc))
            self.study.tell(trial, state=TrialState.FAIL)
            return
        so_far = self.study.get_trials(deepcopy=False)
        if (role == Role.LATE and cfg.device == Device.CUDA and cfg.compile != CompileMode.OFF
                and (lost := late.compile_lost(so_far))):
            trial.set_user_attr(StudyAttr.SKIPPED, lost)  # its slot goes to the sampler
            self.study.tell(trial, state=TrialState.FAIL)
            return
        # a compile on a GPU is priced against the whole run (less verification at its least):
        # what it finds pays in every later process, which compile from the run's cache
        left_s = (self.budget.room_left_s(self.outcome, once_s=late.compile_estimate_s(so_far, cfg))
                  if late.priced_on_the_run(cfg) else self.budget.left_s())
        if left_s is not None and (late_why := late.too_late(so_far, cfg, left_s=left_s)):
            trial.set_user_attr(StudyAttr.SKIPPED, late_why)
            self.study.tell(trial, state=TrialState.FAIL)
            return
        trial.set_user_attr(StudyAttr.CONFIG, cfg.to_dict())

        previous = self.ledger.previous(cfg)
        if previous is not None and role != Role.BASELINE and not trial.user_attrs.get(StudyAttr.RETRY):
            trial.set_user_attr(StudyAttr.DUPLICATE_OF, previous.number)
            if previous.state == TrialState.COMPLETE:
                self.study.tell(trial, previous.value)
            else:
                trial.set_user_attr(StudyAttr.FAILURE, previous.user_attrs.get(StudyAttr.FAILURE))
                self.study.tell(trial, state=TrialState.FAIL)
            return
        too_big = self.ledger.memory_bound(cfg)
        if too_big is not None:
            trial.set_user_attr(StudyAttr.SKIPPED, too_big)
            trial.set_user_attr(StudyAttr.FAILURE, Failure.OUT_OF_MEMORY)
            self.study.tell(trial, state=TrialState.FAIL)
            return

        number = len(self.ledger.measured()) + max(1, len(self.ledger.running()))  # this one is running too
        self.progress(ProgressEvent.START, TrialStart(number=number, of=self.budget.trials, config=cfg, role=role,
                                                      elapsed=self.budget.elapsed_s()))

        def on_window(i: int, value: float) -> bool:
            trial.report(value, step=i)
            self.progress(ProgressEvent.WINDOW, TrialWindow(i, value))
            return trial.should_prune()

        try:
            with self.turns.measuring():
                result = self.runner.run(cfg, name=f"trial-{trial.number:04d}", on_window=on_window,
                                         timeout_s=late.trial_limit_s(so_far, cfg, least_s=self.runner.timeout_s))
        except BaseException:
            # Interrupted (Ctrl-C): this trial is measured again when the run resumes.
            trial.set_user_attr(StudyAttr.FAILURE, Failure.INTERRUPTED)
            self.study.tell(trial, state=TrialState.FAIL)
            if not trial.user_attrs.get(StudyAttr.RETRY) and not is_rung(trial):  # the ladder takes it again
                self.study.enqueue_trial(trial.params, user_attrs={StudyAttr.ROLE: role, StudyAttr.RETRY: True})
            raise
        planned_s = self._tell(trial, cfg, result)
        best = self._best_value()
        planned = self.scoring.planned(best=best, planned_s=planned_s, one_time_s=result.one_time_s)
        self.progress(ProgressEvent.END, TrialEnd(result=result, config=cfg, role=role, best=best, planned=planned))

    def _tell(self, trial: optuna.Trial, cfg: TrialConfig, result: TrialResult) -> float | None:
        """Store the trial's result and value; returns its planned run's predicted time
        (None without a plan, or when it was not measured to the end)."""
        summary, value, planned_s = self.scoring.score(cfg, result)
        trial.set_user_attr(StudyAttr.RESULT, summary)
        if result.status == Status.OK and value is not None:
            self.study.tell(trial, value)
        elif result.status == Status.PRUNED:
            self.study.tell(trial, state=TrialState.PRUNED)
        else:
            trial.set_user_attr(StudyAttr.FAILURE, result.failure)
            self.study.tell(trial, state=TrialState.FAIL)
            if result.failure == Failure.OUT_OF_MEMORY and trial.user_attrs.get(StudyAttr.ROLE) != Role.BASELINE:
                self._rescue(cfg)  # the baseline's: the reference's ladder (_next_rung)
        return planned_s if result.status == Status.OK else None

    def _held_to_fit(self, cfg: TrialConfig) -> TrialConfig:
        """``cfg``, or where the trials so far say it will not fit, it holding less
        (``memory.rescue``) as far as a step is left: the memory knobs are not sampled, and
        a sampled configuration at a batch that ran out of memory would never run."""
        while self.ledger.memory_bound(cfg) is not None and (held := memory.rescue(cfg, self.space)) is not None:
            cfg = held
        return cfg

    def _rescue(self, cfg: TrialConfig) -> None:
        """Queue ``cfg`` holding less (``memory.rescue``), which ran out of memory or over
        the limit: its batch is written off only once nothing is left to try. (The
        baseline that did is measured holding less at once: ``_next_rung``.)"""
        held_less = memory.rescue(cfg, self.space)
        if held_less is None:
            return
        try:
            params = self.space.params_of(held_less)
        except ValueError:  # a knob outside the space: not searchable
            return
        with self.turns.lock():
            self.study.enqueue_trial(params, user_attrs={StudyAttr.ROLE: Role.MEMORY})

    def _best_value(self) -> float | None:
        try:
            return self.study.best_value
        except ValueError:
            return None

    def outcome(self) -> SearchOutcome:
        return outcome_of(self.ledger)
