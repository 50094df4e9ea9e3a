"""Where the search's Optuna study lives: its journal file or its database, its name,
opening it to search, reading it to report, repairing it after a cut-short write, and the
lock its workers take turns under.

One study per (model file, machine fingerprint), stored in the output folder as an Optuna
journal file (``study.journal``), so running the same command again resumes it; or, with
``--storage``, in a PostgreSQL database that several machines share (Optuna's RDBStorage:
its documentation recommends it for several machines, and warns that the journal file's
locks may not work over NFS). How the search samples and prunes is
``autotune.search.tuner``'s business; this module only stores.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
import optuna.storages.journal

from autotune.errors import AutotuneError, UsageError
from autotune.trials.protocol import StudyAttr

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


def shown_url(url: str) -> str:
    """``url`` as it may be printed or written: its password masked. A text that does not
    parse as a URL is not echoed at all (it may be a password pasted in the wrong place)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except (ArgumentError, ValueError):
        return "(the --storage value, not shown)"


def _postgres_url(url: str) -> str:
    """``url`` with the PostgreSQL driver that is installed; UsageError for another database
    or no driver, naming what to do."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        raise UsageError(f"--storage: {shown_url(url)} is not a database URL; give a PostgreSQL "
                         "one, e.g. postgresql://USER:PASSWORD@HOST/DATABASE") from None
    if parsed.get_backend_name() != "postgresql":
        raise UsageError(f"--storage: {shown_url(url)} is a {parsed.get_backend_name()} URL; a shared "
                         "study lives in PostgreSQL (postgresql://USER:PASSWORD@HOST/DATABASE). Without "
                         "--storage the study is a journal file in the output folder, for one machine.")
    installed = [m for m in ("psycopg", "psycopg2") if _importable(m)]
    missing = UsageError(f"--storage {shown_url(url)} needs a PostgreSQL driver for Python: "
                         "pip install 'autotune[postgres]' (psycopg)")
    if "+" in parsed.drivername:  # the user named the driver
        driver = parsed.drivername.split("+", 1)[1]
        if driver in ("psycopg", "psycopg2") and driver not in installed:
            raise missing
    elif installed:  # SQLAlchemy's plain postgresql:// means psycopg2: take the one that is here
        parsed = parsed.set(drivername=f"postgresql+{installed[0]}")
    else:
        raise missing
    return parsed.render_as_string(hide_password=False)


def _importable(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def database_storage(url: str, *, heartbeat_s: int,
                     on_stale: Callable[[optuna.Study, optuna.trial.FrozenTrial], None],
                     ) -> optuna.storages.RDBStorage:
    """The shared study's database, for a worker. Its running trial records a heartbeat
    every ``heartbeat_s``; one silent for three times that (its worker died) is failed by
    the next worker that looks, and ``on_stale`` is called with it."""
    with warnings.catch_warnings():  # heartbeat_interval is "experimental", and what we need
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return open_database(url, heartbeat_interval=heartbeat_s, grace_period=3 * heartbeat_s,
                             heartbeat_stale_trial_callback=on_stale)


def open_database(url: str, **options: Any) -> optuna.storages.RDBStorage:
    """The PostgreSQL database at ``url`` as Optuna's storage (``options`` are
    RDBStorage's); errors name the URL with its password masked."""
    import sqlalchemy
    import sqlalchemy.exc

    full = _postgres_url(url)
    try:
        # Optuna creates its tables on a new database; two workers starting together would
        # both create them, and PostgreSQL refuses the second ("duplicate key value violates
        # unique constraint pg_type_typname_nsp_index"): one at a time.
        engine = sqlalchemy.create_engine(full)
        try:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                key = {"k": lock_key("tables")}
                conn.execute(sqlalchemy.text("SELECT pg_advisory_lock(:k)"), key)
                try:
                    return optuna.storages.RDBStorage(url=full, engine_kwargs={"pool_pre_ping": True}, **options)
                finally:
                    conn.execute(sqlalchemy.text("SELECT pg_advisory_unlock(:k)"), key)
        finally:
            engine.dispose()
    except sqlalchemy.exc.SQLAlchemyError as exc:
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        password = _password(full)
        if password:
            reason = reason.replace(password, "***")
        raise UsageError(f"--storage: the study database {shown_url(url)} cannot be used: {reason}") from None


def _password(url: str) -> str | None:
    from sqlalchemy.engine import make_url

    return make_url(url).password


def lock_key(name: str) -> int:
    """The advisory lock's number for ``name`` (PostgreSQL's are 64-bit integers)."""
    return int.from_bytes(hashlib.sha256(f"autotune:{name}".encode()).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def study_lock(storage: optuna.storages.RDBStorage, name: str, *, wait: bool = True) -> Iterator[bool]:
    """One worker at a time, across the machines that share the study in ``storage`` (as
    ``database_storage`` made it: a study wraps it in a cache): a PostgreSQL advisory lock
    on ``name``, held by one database session, so the server releases it when its holder
    dies. Yields whether it was taken (always, with ``wait``)."""
    from sqlalchemy import text

    key = lock_key(name)
    # AUTOCOMMIT: no transaction stays open while the lock is held (a verification takes
    # minutes, and servers may end sessions idle in a transaction)
    with storage.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        if wait:
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": key})
            taken = True
        else:
            taken = bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar())
        try:
            yield taken
        finally:
            if taken:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})


def create_or_resume(*, storage: optuna.storages.BaseStorage | Path, study_name: str,
                     sampler: optuna.samplers.BaseSampler,
                     pruner: optuna.pruners.BasePruner) -> optuna.Study:
    """The study ``study_name`` in ``storage`` (a journal file's path, or a storage),
    created when new. Samplers and pruners are not stored: a resumed study gets the ones
    given here."""
    if isinstance(storage, Path):
        storage = _storage(storage)
    with quiet_optuna():
        return optuna.create_study(
            storage=storage, study_name=study_name, direction="maximize",
            sampler=sampler, pruner=pruner, load_if_exists=True,
        )


def settle_space(study: optuna.Study, choices: dict[str, list[Any]], *, where: str) -> None:
    """Store the searched values per knob on a new study; refuse to resume one searched over
    other values (another --batch-range, a machine that gained an allocator): Optuna cannot
    sample a knob whose values changed ("dynamic value space"). A study stored before this
    check holds no record, and is resumed as before."""
    mine = json.loads(json.dumps(choices))
    stored = study.user_attrs.get(StudyAttr.SPACE)
    if stored is None:
        if not study.get_trials(deepcopy=False):
            study.set_user_attr(StudyAttr.SPACE, mine)
        return
    changed = sorted(k for k in set(stored) | set(mine) if stored.get(k) != mine.get(k))
    if changed:
        shown = "; ".join(f"{k}: {stored.get(k)} then, {mine.get(k)} now" for k in changed)
        raise UsageError(f"the study in {where} searched other values of {', '.join(changed)} ({shown}). Its "
                         "trials cannot be resumed over these: tune into another --out (or, for a shared study, "
                         "another --study), or run with the options it was made with")


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
