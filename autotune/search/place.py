"""Where a run's study is kept: a journal in the output folder, resumed when there is one,
or a database that several workers share (``search.shared``)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import optuna
import optuna.storages

from autotune.probes import fingerprint, fingerprint_id
from autotune.search import shared
from autotune.search.study import database_storage, repair_journal, shown_url, storage_path, study_lock, study_name
from autotune.search.tuner import open_study, retry_stale
from autotune.search.turns import Turns, once
from autotune.sections import SharingOptions
from autotune.space import Space
from autotune.trials import measure_lock
from autotune.workbench import Workbench


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

    def turns(self, *, notice: Callable[[str], None]) -> Turns:
        """How the tuner takes turns with the study's other workers: the study's queue under
        its lock in the database, one measurement at a time on this machine (``notice``
        says, once, that it waits)."""
        if self.storage is None:
            return Turns()
        storage, told = self.storage, once(notice)
        return Turns(shared=True, lock=lambda: study_lock(storage, f"{self.name}:queue"),
                     measuring=lambda: measure_lock.held(notice=told))


def open_place(workbench: Workbench, sharing: SharingOptions, *, space: Space) -> StudyPlace:
    """The run's study, resumed when there is one; for a shared study, with when its budget
    began (the study refuses a worker that is not what it was created for)."""
    task, out, reporter = workbench.task, workbench.out, workbench.reporter
    name = sharing.study or study_name(task.path, fingerprint_id(workbench.machine.to_json()))
    if sharing.storage is None:
        repaired = repair_journal(storage_path(out))
        if repaired:
            reporter.warn(repaired)
        study = open_study(storage_path=storage_path(out), study_name=name)
        resumed = len(study.trials)
        if resumed:
            reporter.info(f"resuming the study in {out} ({resumed} trials stored)")
        return StudyPlace(study=study, name=name)
    storage = database_storage(sharing.storage, heartbeat_s=sharing.heartbeat_s, on_stale=retry_stale)
    study = open_study(storage=storage, study_name=name)
    started_at = shared.join(study, storage, lock_name=f"{name}:queue", mine=shared.StudyIdentity.of(
        fingerprint=fingerprint(workbench.machine), model_file=task.path, space=space.describe()))
    reporter.info(f"a worker of the study {name!r} in {shown_url(sharing.storage)} "
                  f"({len(study.trials)} trials stored)")
    return StudyPlace(study=study, name=name, storage=storage, started_at=started_at)
