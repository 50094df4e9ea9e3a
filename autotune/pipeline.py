"""One tuning run: probe -> space -> search -> verify -> emit.

``tune`` takes the output folder and the machine-wide measurement lock and runs
``execute``; ``execute`` is the run itself, with the machine description and the
trial runner as arguments, so that the whole pipeline can be driven on recorded
probes of other machines by a stand-in runner (tests/test_machine_matrix.py).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune import __version__
from autotune.config import TrialConfig
from autotune.document.ablation import Ablation
from autotune.document.batch import BatchChoice
from autotune.document.measures import Baseline, Best, Interval, LayoutEffect, PrecisionNote, Rejection
from autotune.document.memory import MemoryFit
from autotune.document.plan import PlannedRun
from autotune.document.run import Ranked, RunDocument, SearchSummary, SpaceSummary
from autotune.document.stages import Stage, StageRecord, VerificationStages
from autotune.document.utilisation import Utilisation, pick_facts, trial_facts
from autotune.emit import launch, outdir, outputs
from autotune.errors import NotVerified
from autotune.harness import candidate_emitter, make_runner
from autotune.harness import memory_limit as host_memory_limit
from autotune.options import RunOptions
from autotune.probes import Machine, as_machine, fingerprint, fingerprint_id, probe_machine
from autotune.report.console import Reporter
from autotune.report.files import write_report
from autotune.search import batch_range, shared
from autotune.search.ledger import measured_trials
from autotune.search.memory import MemoryLimit, fit_of, known_to_fit, nothing_fits
from autotune.search.objective import Plan, Pricing
from autotune.search.starts import heuristics
from autotune.search.study import (
    database_storage,
    repair_journal,
    settle_space,
    shown_url,
    storage_path,
    study_lock,
    study_name,
)
from autotune.search.tuner import Candidate, SearchOutcome, Tuner, open_study, retry_stale
from autotune.space import Space, build_space
from autotune.task import Task, load_task
from autotune.trials import measure_lock, proctree
from autotune.trials.protocol import Failure, StudyAttr
from autotune.trials.runner import TrialRunnerLike
from autotune.verify import batch as verify_batch
from autotune.verify import fit, gates, standalone, stats, step_profile
from autotune.verify.candidates import batch_rival, choose_candidates, layout_contrast
from autotune.verify.deadline import Budget, Costs, search_timeout
from autotune.verify.device_room import DeviceRoom
from autotune.verify.trainings import slowest_rate, work_key

if TYPE_CHECKING:
    import optuna
    import optuna.storages

EXIT_VERIFIED = 0
EXIT_NOT_VERIFIED = 3



def build_task_space(task: Task, machine: Machine, options: RunOptions) -> Space:
    return build_space(machine, baseline_batch=task.batch_size, dataset_len=task.dataset_len,
                       image_inputs=task.image_inputs, batchnorm_layers=task.batchnorm_layers,
                       blocks=task.blocks, optimizer=task.optimizer,
                       has_evaluate=task.has_evaluate, has_training_step=task.has_training_step,
                       max_quality_drop=options.max_quality_drop,
                       exact=options.exact, fixed=options.fixed, batch_range=options.batch_range,
                       scale_lr=options.scale_lr)


def memory_limit(options: RunOptions, machine: Machine) -> MemoryLimit:
    """What one rank may hold: --memory-limit, else the machine's share (``search.memory``)."""
    host = host_memory_limit(machine)
    return MemoryLimit(user_mb=options.memory_limit_mb, host_mb=host / 2**20 if host else None)


def fits_in_memory(outcome: SearchOutcome, options: RunOptions, machine: Machine) -> Callable[[TrialConfig], bool]:
    """Whether a configuration is known to fit in memory, from the search's trials."""
    return known_to_fit(memory_limit(options, machine), measured=[(c.config, c.result) for c in outcome.ranked],
                        failed=[(f.config, f.failure, f.message) for f in outcome.failures])


def layout_effect(verdicts: list[gates.Verdict], top: TrialConfig, space: Space,
                  machine: Machine) -> LayoutEffect | None:
    """The first candidate against its layout contrast, window against window, where
    verification measured both."""
    contrast = layout_contrast(top, space, machine)
    by_cfg = {v.config: v.speed for v in verdicts}
    if contrast is None or top not in by_cfg or contrast not in by_cfg:
        return None
    a, b = by_cfg[top].get("samples_per_s"), by_cfg[contrast].get("samples_per_s")
    if not a or not b:
        return None
    multi, single = (a, b) if top.nprocs > 1 else (b, a)
    multi_cfg, single_cfg = (top, contrast) if top.nprocs > 1 else (contrast, top)
    return LayoutEffect(multi_rank=multi_cfg.layout, single_process=single_cfg.layout,
                        other_knobs={k: v for k, v in top.to_dict().items()
                                     if k not in ("nprocs", "threads")},
                        effect=Interval.from_json(stats.paired_ratio(multi, single)))


def precision_note(chosen: TrialConfig, winner: gates.Verdict | None,
                   verdicts: list[gates.Verdict], space: Space, *, exact: bool) -> PrecisionNote:
    """Which precision was chosen, how it was checked, why the others were not, and how
    to opt out: what the summary and best_config.json say about precision."""
    def label(cfg: TrialConfig) -> str:
        return cfg.precision + (f" pruned {cfg.prune_ratio:g}" if cfg.prune_ratio else "")

    rejected: dict[str, str] = {}
    for v in verdicts:
        if v is winner or v.passed or v.config.exact or label(v.config) == label(chosen):
            continue
        failed = {name: c for name, c in v.checks.items() if c.passed is False}
        if set(failed) & {"numerics", "quality"}:  # the knob's own fault, not speed or script
            rejected.setdefault(label(v.config), "; ".join(
                f"{name}: {c.detail.get('reason', 'failed')}" for name, c in failed.items()))
    opt_out = None
    if exact:
        opt_out = "--exact was given: fp32 and no pruning throughout"
    elif not chosen.exact:
        opt_out = "run with --exact (or --fix precision=fp32) to keep everything in fp32"
    return PrecisionNote(
        chosen=chosen.precision,
        checked=gates.describe_checks(winner) if winner is not None else None,
        rejected=rejected,
        instead=(f"the fastest verified configuration ({label(chosen)})" if winner is not None
                 else "the baseline"),
        opt_out=opt_out,
        skipped={k: r for k, r in space.excluded.items() if k.startswith(("precision", "prune"))})


def build_document(
    *, task: Task, machine: Machine, space: Space, chosen: TrialConfig,
    baseline_cfg: TrialConfig, base_speed: dict[str, Any], winner: gates.Verdict | None,
    verdicts: list[gates.Verdict], search: SearchSummary, ranked: Sequence[Candidate], exact: bool,
    layout: LayoutEffect | None, environment: Mapping[str, str], pricing: Pricing | None = None,
    stages: VerificationStages | None = None, memory: MemoryFit | None = None,
    batch: BatchChoice | None = None, baseline_result: Mapping[str, Any] | None = None,
    trials: Sequence[tuple[TrialConfig, Mapping[str, Any]]] = (),
) -> RunDocument:
    """The run's document, assembled once from what each stage built; ``trials``: every
    measured trial of the study, pruned ones too (their first step's facts)."""
    claim = winner.standalone if winner is not None else None
    if winner is not None and claim is None:
        raise AssertionError("a winner passed its standalone check, which has figures")
    best = None
    if winner is not None and claim is not None:
        # by what the configuration computes: where ablation dropped a placement knob
        # (threads, workers), what was measured of the same work still tells its memory
        result = next((c.result for c in ranked if c.config == chosen), None) or next(
            (c.result for c in ranked if work_key(c.config) == work_key(chosen)), {})
        best = Best(samples_per_s=claim.median_samples_per_s,
                    peak_mem_mb=result.get("peak_rss_mb"), one_time_s=result.get("one_time_s"),
                    cuda_peak_mb=result.get("cuda_peak_mb"),
                    cuda_total_mb=result.get("cuda_total_mb"))
    # With a winner, the rates and the speedup are those of the standalone pairs (what the
    # user will measure); without one, the baseline's side-by-side (or search) rate.
    baseline = Baseline(
        config=baseline_cfg,
        samples_per_s=(claim.baseline_median_samples_per_s if claim is not None
                       else base_speed["median_samples_per_s"]),
        runs=tuple(claim.baseline_samples_per_s if claim is not None
                   else base_speed["samples_per_s"]))
    return RunDocument(
        model_file=str(task.path), autotune_version=__version__,
        fingerprint={**fingerprint(machine.to_dict()), "id": fingerprint_id(machine.to_dict())},
        config=chosen, baseline=baseline, best=best,
        speedup=claim.speedup if claim is not None else None,
        verification=dict(winner.checks) if winner is not None else {},
        precision=precision_note(chosen, winner, verdicts, space, exact=exact),
        rejected=tuple(Rejection(config=v.config, reason=v.reason, checks=dict(v.checks))
                       for v in verdicts if v is not winner and not v.passed),
        candidates=tuple(gates.outcomes(verdicts, winner, pricing)),
        search=search,
        space=SpaceSummary(included=space.choices, fixed=space.fixed, excluded=space.excluded),
        layout_effect=layout, environment=environment,
        ablation=winner.ablation if winner is not None else None, stages=stages, memory=memory, batch=batch,
        utilisation=Utilisation.of(
            baseline_facts=trial_facts(baseline_result), baseline_samples_per_s=baseline.samples_per_s,
            pick_facts=pick_facts(chosen, [(c.config, c.result) for c in ranked] + list(trials), work_key=work_key)
            if best else None,
            pick_samples_per_s=best.samples_per_s if best else None),
        plan=None if pricing is None else PlannedRun.of(
            pricing, baseline=baseline_cfg, baseline_samples_per_s=baseline.samples_per_s, chosen=chosen,
            chosen_samples_per_s=best.samples_per_s if best is not None else baseline.samples_per_s))


def output_folder(model_file: Path, out: Path | None) -> Path:
    """Where a run writes: ``out``, else ``autotune-out/<model name>``; absolute, since
    trials and scripts run with other working directories."""
    return (out or Path("autotune-out") / model_file.stem).absolute()


def tune(model_file: Path, *, out: Path | None, options: RunOptions, reporter: Reporter,
         force: bool = False) -> RunDocument:
    """The run as the CLI starts it: the output folder held exclusively, the model file
    checked before anything is created, one measuring autotune per machine."""
    started = time.time()  # --timeout counts from here
    out = output_folder(model_file, out)
    # Subreaper first: processes the model file starts during its check are ours to end.
    proctree.become_subreaper()
    try:
        with contextlib.ExitStack() as stack:
            outdir.check_ours(out, force=force)
            if out.is_dir():  # a busy folder is refused before the model file is even checked
                stack.enter_context(outdir.exclusive(out))
            # before creating anything: bad input loses nothing; the model where trials put it
            task = load_task(model_file, device="cpu" if options.fixed.get("device") == "cpu" else None)
            Plan.of(train_steps=options.train_steps, epochs=options.epochs, batch_size=task.batch_size,
                    dataset_len=task.dataset_len)  # --epochs of a data set without a length: refused here
            proctree.reap_orphans()
            if not out.is_dir():
                stack.enter_context(outdir.exclusive(outdir.prepare(out)))
            if options.storage is None:
                stack.enter_context(measure_lock.held(notice=reporter.warn))
            # else the workers of a shared study on this machine take turns per trial
            machine = probe_machine()
            runner = make_runner(task, machine, out, window_s=options.window_s,
                                 windows=options.windows, trial_timeout_s=options.trial_timeout_s,
                                 hang_timeout_s=options.hang_timeout_s, warm=options.warm_trials)
            stack.callback(runner.close)
            return execute(task, out, options, machine=machine, runner=runner, reporter=reporter,
                           started_at=started)
    finally:
        proctree.reap_orphans()


@dataclasses.dataclass(frozen=True)
class StudyPlace:
    """Where the run's study is: a journal in the output folder, or a shared database
    (``storage``), under ``name``; a shared study's budget began at ``started_at``."""

    study: optuna.Study
    name: str
    storage: optuna.storages.RDBStorage | None = None  # a shared study's
    started_at: float | None = None  # epoch seconds

    @property
    def shared(self) -> bool:
        return self.storage is not None


def once(say: Callable[[str], None]) -> Callable[[str], None]:
    """``say``, for the first message only: the workers of a shared study on one machine
    wait for each other at every trial."""
    said: list[str] = []

    def first(text: str) -> None:
        if not said:
            said.append(text)
            say(text)
    return first


def open_place(task: Task, out: Path, options: RunOptions, *, machine: Machine, space: Space,
               reporter: Reporter) -> StudyPlace:
    """The run's study, resumed when there is one; for a shared study, with when its budget
    began (the study refuses a worker that is not what it was created for)."""
    fp = fingerprint(machine.to_dict())
    name = options.study or study_name(task.path, fingerprint_id(machine.to_dict()))
    if options.storage is None:
        repaired = repair_journal(storage_path(out))
        if repaired:
            reporter.warn(repaired)
        study = open_study(storage_path=storage_path(out), study_name=name)
        resumed = len(study.trials)
        if resumed:
            reporter.info(f"resuming the study in {out} ({resumed} trials stored)")
        return StudyPlace(study=study, name=name)
    storage = database_storage(options.storage, heartbeat_s=options.heartbeat_s, on_stale=retry_stale)
    study = open_study(storage=storage, study_name=name)
    started_at = shared.join(study, storage, lock_name=f"{name}:queue", mine=shared.identity(
        fingerprint=fp, model_file=task.path, space=space.describe()))
    reporter.info(f"a worker of the study {name!r} in {shown_url(options.storage)} "
                  f"({len(study.trials)} trials stored)")
    return StudyPlace(study=study, name=name, storage=storage, started_at=started_at)


def leave_for_verification(task: Task, options: RunOptions, *, space: Space, machine: Machine,
                           ends_at: float) -> Callable[[SearchOutcome], str | None]:
    """Under --timeout, why the search starts no more trials: what is left would not hold
    another trial and verification at its least (``fit.least``: the candidates the search
    has so far, with its costs estimated from the trials so far)."""
    settings = gates.Settings(rounds=options.rounds, pairs=options.pairs, pair_seconds=options.pair_seconds)

    def enough(outcome: SearchOutcome) -> str | None:
        if outcome.baseline is None or not outcome.ranked:
            return None
        baseline = outcome.baseline.config
        others = [c for c in outcome.ranked if c.config != baseline]
        candidates = choose_candidates([c.config for c in others], top=options.top, space=space, machine=machine,
                                       fits=fits_in_memory(outcome, options, machine), rival=batch_rival(others))
        costs = Costs.from_trials([c.result for c in outcome.ranked], window_s=options.window_s,
                                  baseline_rate=outcome.baseline.measured.samples_per_s)
        need = fit.least(settings, candidates, baseline=baseline, costs=costs,
                         has_evaluate=task.has_evaluate, shortest_run_s=options.window_s * options.windows)
        walls = [float(c.result.get("wall_s") or 0.0) for c in outcome.ranked]
        if not room_for_another(now=time.time(), ends_at=ends_at, trial_walls=walls, need_s=need):
            return (f"--timeout {options.timeout_s:g} s: the rest is verification's, about {need:.0f} s "
                    "at its least")
        return None
    return enough


def room_for_another(*, now: float, ends_at: float, trial_walls: Sequence[float], need_s: float) -> bool:
    """Whether another trial and then verification at its least (``need_s``, with
    ``fit.MARGIN``) fit by ``ends_at``. The next trial may start a fresh process where the
    last ones ran warm, and a new best brings other candidates: room is kept for the
    longest trial so far."""
    return now + max(trial_walls, default=0.0) + need_s * fit.MARGIN <= ends_at


def search(task: Task, out: Path, options: RunOptions, *, machine: Machine, space: Space,
           runner: TrialRunnerLike, reporter: Reporter,
           plan: Plan | None = None, started_at: float | None = None
           ) -> tuple[StudyPlace, SearchOutcome, Space]:
    """The search, resumed from the study in ``out`` (or the shared one) when there is one;
    under --timeout it has its share of the time from ``started_at`` (a shared study's: from
    when the study began). Returns the space it searched: ``space`` with the batch sizes of
    the machine (``search.batch_range``). Raises NotVerified when the baseline could not be
    measured: nothing could be compared with it."""
    place = open_place(task, out, options, machine=machine, space=space, reporter=reporter)
    starts = heuristics(space, machine)
    # a shared study's ramp is measured once, by the first worker; the others wait for it
    with (study_lock(place.storage, f"{place.name}:ramp") if place.storage is not None
          else contextlib.nullcontext()):
        space, ramp = batch_range.settle(
            place.study, space, runner=runner, start=starts[0] if starts else space.baseline,
            has_evaluate=task.has_evaluate, dataset_len=task.dataset_len, limit=memory_limit(options, machine),
            batch_range=options.batch_range, say=reporter.info,
            ends_at=None if options.timeout_s is None else (started_at or time.time())
            + (search_timeout(options.timeout_s) or 0.0) * batch_range.TIMEOUT_SHARE)
        settle_space(place.study, space.recorded,
                     where=shown_url(options.storage) if options.storage else str(out))
    sharing: dict[str, Any] = {"started_at": started_at}
    if place.storage is not None:
        storage, notice = place.storage, once(reporter.warn)
        sharing = dict(shared=True, started_at=place.started_at,
                       lock=lambda: study_lock(storage, f"{place.name}:queue"),
                       measuring=lambda: measure_lock.held(notice=notice))
    enough = None
    if options.timeout_s is not None:
        began = sharing["started_at"] if sharing["started_at"] is not None else time.time()
        enough = leave_for_verification(task, options, space=space, machine=machine,
                                        ends_at=began + options.timeout_s)
    tuner = Tuner(study=place.study, space=space, runner=runner, trials=options.trials,
                  timeout_s=search_timeout(options.timeout_s), progress=reporter.search,
                  heuristics=starts, plan=plan, enough=enough,
                  fastest_batch=ramp.fastest[0] if ramp is not None and ramp.fastest else None,
                  memory_limit=memory_limit(options, machine), **sharing)
    try:
        outcome = tuner.run()
    finally:
        reporter.end_search()
    if outcome.baseline is None:
        failed = next((f for f in outcome.failures if f.config == space.baseline),
                      outcome.failures[0] if outcome.failures else None)
        detail = (f"{Failure.describe(failed.failure)}: {failed.message}"
                  if failed else "it was not measured")
        fix = "Fix the model so it trains as it is"
        if failed is not None and failed.failure == Failure.OUT_OF_MEMORY:
            tried = [f.config.short() for f in outcome.failures
                     if f.failure == Failure.OUT_OF_MEMORY and f.config != space.baseline
                     and f.config.batch_size == space.baseline.batch_size]
            least = nothing_fits(memory_limit(options, machine), outcome.reference_tried)
            if least is not None:  # what it held, as it is and holding less, says what would fit
                fix = ("It ran out of memory" + (f", and so did it holding less ({len(tried)} configurations "
                                                 "at its batch)" if tried else "") + f": {least}")
            else:
                fix = ("It ran out of memory" + (f", and so did it holding less ({'; '.join(tried)})" if tried else "")
                       + ": give a smaller batch size in the model file, or more memory")
        raise NotVerified(
            "no configuration can be verified: the baseline (your batch size, one process, "
            f"default threads, fp32) failed: {detail}. {fix}; "
            f"trial logs are in {out / 'trials'}."
        )
    return place, outcome, space


def execute(task: Task, out: Path, options: RunOptions, *, machine: Machine | Mapping[str, Any],
            runner: TrialRunnerLike, reporter: Reporter, started_at: float | None = None) -> RunDocument:
    """Search, verify and emit for ``task`` on ``machine`` (or a recorded probe document of
    it), measuring with ``runner``; returns the result document as written to ``out``.
    ``started_at``: when the run began (epoch seconds; default now), what --timeout
    bounds the run from."""
    started = time.time() if started_at is None else started_at
    machine = as_machine(machine)
    for w in machine.warnings:
        reporter.warn(w)
    inherited = launch.inherited_distributed(os.environ)
    if inherited:
        reporter.warn(f"{', '.join(inherited)} from your environment are not passed to trials: "
                      "each trial starts its own rank group on this machine")
    space = build_task_space(task, machine, options)
    for knob, reason in space.excluded.items():
        reporter.info(f"  skipping {knob}: {reason}")
    plan = Plan.of(train_steps=options.train_steps, epochs=options.epochs, batch_size=task.batch_size,
                   dataset_len=task.dataset_len)
    if plan is not None:
        reporter.info(f"ranking by the planned run's predicted time: {plan.describe()}")
    place, outcome, space = search(task, out, options, machine=machine, space=space, runner=runner,
                            reporter=reporter, plan=plan, started_at=started)
    ends_at = None if options.timeout_s is None else (place.started_at or started) + options.timeout_s

    def verify_here() -> RunDocument:
        return verify(task, out, options, machine=machine, space=space, place=place, outcome=outcome,
                      runner=runner, reporter=reporter, plan=plan, ends_at=ends_at)

    def emit(document: RunDocument) -> RunDocument:
        env, warnings = launch.environment(document.config, machine=machine)
        for w in warnings:
            reporter.warn(w)
        doc = outputs.write_outputs(out, cfg=document.config, model_file=task.path, env=env,
                                    document=dataclasses.replace(document, environment=env),
                                    description=f"Train {task.path.name} with the configuration "
                                                "autotune verified on this machine.",
                                    default_threads=machine.torch.get("num_threads"), blocks=task.blocks)
        return step_profile.profile_emitted(out, doc, runner=runner, options=options, reporter=reporter)

    if place.shared:
        def verify_for_all() -> dict[str, Any]:
            # emitted and profiled before it is published: the workers that take it write the
            # same document, the step profile included (profile_emitted keeps one it finds)
            with measure_lock.held(notice=reporter.warn):
                return emit(verify_here()).to_json()

        assert place.storage is not None
        published, here = shared.verify_once(place.study, place.storage, lock_name=f"{place.name}:verify",
                                             verify=verify_for_all, wait_s=options.verify_wait_s,
                                             notice=reporter.info)
        if not here:
            reporter.info("another worker of the study verified its result: writing the same outputs here")
        doc = emit(RunDocument.from_json(published))
    else:
        doc = emit(verify_here())
    try:
        write_report(out, doc=doc, study=place.study)
    except Exception as exc:  # a finished run never fails over its report
        reporter.warn(f"report.md/report.html not written: {exc}")
    if place.storage is not None:  # the API may run many: each would keep its connections open
        place.storage.engine.dispose()
    return doc


def verify(task: Task, out: Path, options: RunOptions, *, machine: Machine, space: Space,
           place: StudyPlace, outcome: SearchOutcome, runner: TrialRunnerLike,
           reporter: Reporter, plan: Plan | None = None, ends_at: float | None = None) -> RunDocument:
    """Verification of the search's best against the baseline, and the run's document (its
    ``environment`` is the caller's to fill: each machine of a shared study writes its own).
    ``ends_at``: when --timeout ends the run (epoch seconds): the stages are fitted to it."""
    assert outcome.baseline is not None  # search() raises otherwise
    # the user's configuration, or, where it ran out of memory, it holding less (search.memory)
    baseline_cfg = outcome.baseline.config
    default_threads = outcome.baseline.result.get("threads_seen")

    def same_as_baseline(cfg: TrialConfig) -> bool:
        # Setting threads to what torch picks by default changes nothing.
        return cfg == baseline_cfg or (cfg.replace(threads=None) == baseline_cfg
                                       and cfg.threads in (None, default_threads))

    ranked = [c.config for c in outcome.ranked if not same_as_baseline(c.config)]
    limit = memory_limit(options, machine)
    measured = [(c.config, c.result) for c in outcome.ranked]
    failed = [(f.config, f.failure, f.message) for f in outcome.failures]
    fits = known_to_fit(limit, measured=measured, failed=failed)
    pricing = Pricing(plan=plan, measured=tuple(c.measured for c in outcome.ranked)) if plan else None
    candidates = choose_candidates(ranked, top=options.top, space=space, machine=machine, fits=fits,
                                   rival=batch_rival([c for c in outcome.ranked if not same_as_baseline(c.config)]))
    summary = SearchSummary(
        trials=len(place.study.trials), measured=outcome.measured, failures=tuple(outcome.failures),
        ranking=tuple(Ranked(config=c.config.short(), samples_per_s=c.measured.samples_per_s,
                             planned_s=c.result.get("planned_s")) for c in outcome.ranked[:10]),
        study=place.name, storage=shown_url(options.storage) if options.storage else None)
    budget = None
    if ends_at is not None and options.timeout_s is not None:
        budget = Budget(timeout_s=options.timeout_s, ends_at=ends_at, costs=Costs.from_trials(
            [c.result for c in outcome.ranked], window_s=options.window_s,
            baseline_rate=outcome.baseline.measured.samples_per_s))
    # a script that compiles as its trial did may need longer than the scripts' least
    script_timeout_s = standalone.script_timeout_s(gates.Settings.script_timeout_s,
                                                   [c.result for c in outcome.ranked], seconds=options.pair_seconds)
    settings = gates.Settings(rounds=options.rounds, pairs=options.pairs,
                               pair_seconds=options.pair_seconds, script_timeout_s=script_timeout_s,
                               max_quality_drop=options.max_quality_drop, path=options.path,
                               pinned=frozenset(options.fixed), pricing=pricing, budget=budget,
                               fits=fits, room=DeviceRoom.of(machine, measured))
    fitted = None
    if budget is not None and candidates:
        fitted = fit.fit(settings, candidates, baseline=baseline_cfg, budget=budget,
                         has_evaluate=task.has_evaluate, shortest_run_s=options.window_s * options.windows)
        settings, candidates = fitted.settings, fitted.candidates
        for line in [*(f"{stage.named}: {why}" for stage, why in fitted.shortened.items()), fitted.over]:
            if line:
                reporter.info(f"verify: {line}")
    records: list[StageRecord] = []
    if candidates:
        reporter.info(f"verifying {len(candidates)} candidates against the baseline ...")
        winner, verdicts, base_speed = gates.verify_candidates(
            runner, baseline=baseline_cfg, candidates=candidates, reserve=ranked,
            settings=settings, has_evaluate=task.has_evaluate,
            emit_candidate=candidate_emitter(task, machine),
            workdir=out / "verify", progress=reporter.verify, stages=records,
            slowest=slowest_rate(measured_trials(place.study)))
    else:
        winner, verdicts, base_speed = None, [], {}
    if winner is not None and fitted is not None and Stage.ABLATION in fitted.shortened:
        winner.ablation = Ablation(skipped=fitted.shortened[Stage.ABLATION])
    if not base_speed:  # nothing was measured side by side: the search's value stands
        base_speed = {"samples_per_s": [outcome.baseline.value],
                      "median_samples_per_s": outcome.baseline.value}
    chosen = winner.config if winner else baseline_cfg
    batch = verify_batch.describe(
        chosen=chosen, space=space, batch_range=options.batch_range, pinned=options.fixed.get("batch_size"),
        has_evaluate=task.has_evaluate,
        ramp=place.study.user_attrs.get(StudyAttr.BATCH_RAMP), checks=winner.checks if winner else {},
        gated=[(v.config, v.checks) for v in verdicts],
        speedup=winner.standalone.speedup.interval.median if winner and winner.standalone else None)
    return build_document(
        task=task, machine=machine, space=space, chosen=chosen, baseline_cfg=baseline_cfg,
        base_speed=base_speed, winner=winner, verdicts=verdicts, search=summary, ranked=outcome.ranked,
        exact=options.exact, environment={}, pricing=pricing,
        layout=layout_effect(verdicts, candidates[0], space, machine) if candidates else None,
        stages=fit.stages(fitted, records, budget),
        memory=fit_of(limit, chosen=chosen, user=space.baseline, reference=baseline_cfg,
                      user_result=outcome.user_result, measured=measured, failed=failed,
                      alone_peak_mb=winner.standalone.peak_mb if winner and winner.standalone else None),
        batch=batch, baseline_result=outcome.baseline.result, trials=measured_trials(place.study))
