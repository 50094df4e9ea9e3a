"""Where the search's Optuna study lives: its journal file, its name, opening it to search,
reading it to report, repairing it after a cut-short write.

One study per (model file, machine fingerprint), stored in the output folder as an Optuna
journal file (``study.journal``), so running the same command again resumes it. How the
search samples and prunes is ``autotune.search.tuner``'s business; this module only stores.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import optuna
import optuna.storages.journal

from autotune.errors import AutotuneError, UsageError

JOURNAL_NAME = "study.journal"


class StudyDamaged(AutotuneError):
    """The study journal cannot be read and cannot be repaired."""


def study_name(model_file: Path, fingerprint_id: str) -> str:
    return f"{model_file.stem}-{fingerprint_id}"


def storage_path(out_dir: Path) -> Path:
    return Path(os.fspath(out_dir)) / JOURNAL_NAME


@contextlib.contextmanager
def quiet_optuna() -> Iterator[None]:
    """Optuna's INFO lines ("A new study created ...", "Trial 3 finished ...") would
    interleave with autotune's own progress: warnings only while autotune drives it, the
    user's own verbosity restored after (the API may run inside their Optuna work)."""
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(before)


def _storage(path: Path) -> optuna.storages.JournalStorage:
    return optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(path)))


def create_or_resume(*, storage_path: Path, study_name: str, sampler: optuna.samplers.BaseSampler,
                     pruner: optuna.pruners.BasePruner) -> optuna.Study:
    """The study ``study_name`` in the journal at ``storage_path``, created when new.
    Samplers and pruners are not stored: a resumed study gets the ones given here."""
    with quiet_optuna():
        return optuna.create_study(
            storage=_storage(storage_path), study_name=study_name, direction="maximize",
            sampler=sampler, pruner=pruner, load_if_exists=True,
        )


def folder_of(out: str | os.PathLike[str]) -> Path:
    """The output folder, also when given its best_config.json."""
    out = Path(out)
    return out.parent if out.is_file() else out


def load_study(out: str | os.PathLike[str], *, model_file: str | None = None,
               fingerprint_id: str | None = None) -> optuna.Study | None:
    """The run's Optuna study, read from ``study.journal`` without writing to it; None when
    the folder has none. The study named after ``model_file`` and ``fingerprint_id`` (as
    ``autotune run`` names it, from the run document) is preferred; else the journal's last one.
    A journal that cannot be read raises UsageError naming the file.

    Not ``create_or_resume``: ``optuna.create_study(load_if_exists=True)`` appends to the
    journal, and a report must leave the run's folder as it found it."""
    path = storage_path(folder_of(out))
    if not path.is_file() or path.stat().st_size == 0:
        return None
    wanted = None
    if model_file and fingerprint_id:
        wanted = study_name(Path(model_file), fingerprint_id)
    try:
        with quiet_optuna():
            storage = _storage(path)
            names = optuna.get_all_study_names(storage)
            if not names:
                return None
            return optuna.load_study(study_name=wanted if wanted in names else names[-1], storage=storage)
    except (ValueError, KeyError, OSError) as exc:  # a torn journal: JSONDecodeError is a ValueError
        raise UsageError(f"{path}: the study could not be read ({exc}); the report leaves the search "
                         "out. Running `autotune run` on the folder again repairs a torn journal.") from None


# Every operation Optuna's journal writes is one JSON object on one line, beginning so.
_JOURNAL_OP = b'{"op_code":'


def _recovered_line(line: bytes) -> bytes | None:
    """``line`` if it decodes; else the whole operation at its end, if one is there (a
    torn write that a later append joined onto); else None."""
    for candidate in (line, line[line.rfind(_JOURNAL_OP):] if _JOURNAL_OP in line else b""):
        try:
            json.loads(candidate)
            return candidate
        except ValueError:
            continue
    return None


def repair_journal(path: Path) -> str | None:
    """Make a study journal readable again after a write was cut short (the tuner killed
    mid-write, a full disk), under the journal's own lock; returns what was done, or None
    when the file was sound. The damaged file is kept beside it as ``<name>.damaged``.

    Optuna's reader skips a torn last line, and the next append joins onto it: from then
    on every read fails to decode. Here the torn tail is cut off, and a joined line keeps
    the whole operation at its end. Only the torn, never-finished operation is lost: a
    trial it would have finished stays RUNNING and the search measures it again. A line
    that cannot be recovered is refused, naming the file and the way out."""
    if not path.exists() or path.stat().st_size == 0:
        return None
    lock = optuna.storages.journal.JournalFileSymlinkLock(str(path))
    lock.acquire()
    try:
        data = path.read_bytes()
        *lines, tail = data.split(b"\n")
        kept, fixed = [], 0
        for number, line in enumerate(lines, start=1):
            good = _recovered_line(line)
            if good is None:
                raise StudyDamaged(
                    f"{path}: line {number} of the study journal is damaged beyond repair. Move "
                    f"it aside to start a new study (mv '{path}' '{path}.bad'), or restore a "
                    "copy; the trial logs stay in the trials/ folder.")
            fixed += good is not line
            kept.append(good)
        if not tail and not fixed:
            return None
        shutil.copyfile(path, path.with_name(path.name + ".damaged"))
        tmp = path.with_name(path.name + ".repair")
        tmp.write_bytes(b"".join(line + b"\n" for line in kept))
        os.replace(tmp, path)
        damage = (["a torn last write"] if tail else []) + ([f"{fixed} joined line(s)"] if fixed else [])
        return (f"{path} had {' and '.join(damage)} (the tuner was stopped mid-write): "
                f"repaired, the damaged file kept as {path.name}.damaged")
    finally:
        lock.release()
