"""The search stage: the run's study opened (or joined), the batch sizes settled on the
machine (``search.batch_range``), then the tuner until its budget is spent."""
from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

from autotune.errors import ContractError, NotVerified
from autotune.harness import memory_limit as host_memory_limit
from autotune.probes import Machine
from autotune.search import batch_range
from autotune.search.budget import Reserving, SearchBudget, search_timeout
from autotune.search.course import Course, Starts
from autotune.search.memory import MemoryLimit, nothing_fits
from autotune.search.outcome import SearchOutcome
from autotune.search.place import StudyPlace, open_place
from autotune.search.scoring import Scoring
from autotune.search.starts import heuristics
from autotune.search.study import settle_space, shown_url, study_lock
from autotune.search.tuner import Tuner
from autotune.sections import SearchOptions, SharingOptions
from autotune.space import Space
from autotune.task.objective import Pricing
from autotune.trials.protocol import Failure
from autotune.workbench import Workbench


@dataclasses.dataclass(frozen=True)
class Searched:
    """What the search hands on: where its study is, what it found, the space it searched
    (with the machine's batch sizes), what a rank may hold, the planned run priced at the
    search's rates (None without a plan), and when --timeout ends the run (None: no bound)."""

    place: StudyPlace
    outcome: SearchOutcome
    space: Space
    limit: MemoryLimit
    pricing: Pricing | None
    ends_at: float | None


def memory_limit(search: SearchOptions, machine: Machine) -> MemoryLimit:
    """What one rank may hold: --memory-limit, else the machine's share (``search.memory``)."""
    host = host_memory_limit(machine)
    return MemoryLimit(user_mb=search.memory_limit_mb, host_mb=host / 2**20 if host else None)


def run_search(workbench: Workbench, search: SearchOptions, sharing: SharingOptions, *, space: Space,
               started_at: float, reserve: Reserving | None = None) -> Searched:
    """The search, resumed from the study in the output folder (or the shared one) when
    there is one; under --timeout it has its share of the time from ``started_at`` (a shared
    study's: from when the study began), and leaves what ``reserve`` keeps for what comes
    after it (verification at its least).
    Raises NotVerified when the baseline could not be measured: nothing could be compared
    with it."""
    reporter, machine, task = workbench.reporter, workbench.machine, workbench.task
    if search.plan is not None:
        reporter.info(f"ranking by the planned run's predicted time: {search.plan.describe()}")
    place = open_place(workbench, sharing, space=space)
    limit = memory_limit(search, machine)
    starts = heuristics(space, machine)
    # a shared study's ramp is measured once, by the first worker; the others wait for it
    reporter.stage("the batch range")
    with (study_lock(place.storage, f"{place.name}:ramp") if place.storage is not None
          else contextlib.nullcontext()):
        space, ramp = batch_range.settle(
            place.study, space, runner=workbench.runner, start=starts[0] if starts else space.baseline,
            has_evaluate=task.has_evaluate, dataset_len=task.dataset_len, limit=limit,
            batch_range=search.batch_range, say=reporter.info, unjudged=task.unjudged[0],
            for_s=None if search.timeout_s is None
            else (search_timeout(search.timeout_s) or 0.0) * batch_range.TIMEOUT_SHARE)
        settle_space(place.study, space.recorded,
                     where=shown_url(sharing.storage) if sharing.storage else str(workbench.out))
    began = place.started_at if place.started_at is not None else started_at
    ends_at = None if search.timeout_s is None else began + search.timeout_s
    kept = (None if ends_at is None or reserve is None
            else reserve(space=space, limit=limit, ends_at=ends_at,
                         fresh_start=ramp.fresh_start if ramp is not None else None))
    budget = SearchBudget(trials=search.trials, timeout_s=search_timeout(search.timeout_s), started_at=began,
                          enough=None if kept is None else kept.enough,
                          room_s=None if kept is None else kept.room_s)
    course = Course(budget=budget, starts=Starts(heuristics=starts, fastest_batch=fastest_allowed(ramp, space)),
                    scoring=Scoring(plan=search.plan, memory_limit=limit), turns=place.turns(notice=reporter.warn),
                    steers=task.script is None)
    tuner = Tuner(study=place.study, space=space, runner=workbench.runner, course=course, progress=reporter.search)
    outcome = tuner.run()
    if outcome.baseline is None:
        if task.script is not None and (fault := script_fault(outcome, space=space)) is not None:
            raise ContractError(f"{task.path}: the script as written cannot train, so there is nothing to tune: "
                                f"{fault}\nFix it so that `python {task.path.name} ARGS` trains, then run "
                                f"autotune again; trial logs are in {workbench.out / 'trials'}.")
        raise NotVerified(unmeasured(outcome, space=space, limit=limit, out=workbench.out))
    pricing = (None if search.plan is None
               else Pricing(plan=search.plan, measured=tuple(c.measured for c in outcome.ranked)))
    return Searched(place=place, outcome=outcome, space=space, limit=limit, pricing=pricing, ends_at=ends_at)


def fastest_allowed(ramp: batch_range.Ramp | None, space: Space) -> int | None:
    """The ramp's knee (``Ramp.knee``) where ``space`` searches it, else its fastest batch
    among those ``space`` searches (a faster one beyond them is advice,
    ``verify.batch.describe``); None without one."""
    allowed = set(space.choices.get("batch_size", []))
    if ramp is not None and ramp.knee in allowed:
        return ramp.knee
    rates = [(rate, batch) for batch, rate in (ramp.rates if ramp is not None else ()) if batch in allowed]
    return max(rates)[1] if rates else None


def script_fault(outcome: SearchOutcome, *, space: Space) -> str | None:
    """What the user's script raised, in its words (``trials.failure.script_fault``), where its
    configuration as written failed in its own code; None where it failed otherwise."""
    failed = next((f for f in outcome.failures if f.config == space.baseline), None)
    return failed.message if failed is not None and failed.failure == Failure.USER_ERROR else None


def unmeasured(outcome: SearchOutcome, *, space: Space, limit: MemoryLimit, out: Path) -> str:
    """Why nothing can be verified when the search measured no baseline, and what would fix it."""
    failed = next((f for f in outcome.failures if f.config == space.baseline),
                  outcome.failures[0] if outcome.failures else None)
    detail = (f"{Failure.describe(failed.failure)}: {failed.message}"
              if failed else "it was not measured")
    fix = "Fix the model so it trains as it is"
    if failed is not None and failed.failure == Failure.OUT_OF_MEMORY:
        tried = [f.config.short() for f in outcome.failures
                 if f.failure == Failure.OUT_OF_MEMORY and f.config != space.baseline
                 and f.config.batch_size == space.baseline.batch_size]
        least = nothing_fits(limit, outcome.reference_tried)
        if least is not None:  # what it held, as it is and holding less, says what would fit
            fix = ("It ran out of memory" + (f", and so did it holding less ({len(tried)} configurations "
                                             "at its batch)" if tried else "") + f": {least}")
        else:
            fix = ("It ran out of memory" + (f", and so did it holding less ({'; '.join(tried)})" if tried else "")
                   + ": give a smaller batch size in the model file, or more memory")
    return ("no configuration can be verified: the baseline (your batch size, one process, "
            f"default threads, fp32) failed: {detail}. {fix}; "
            f"trial logs are in {out / 'trials'}.")
