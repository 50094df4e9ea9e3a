"""Several workers tune one study in a real PostgreSQL database (``--storage``): one budget,
the start enqueued once, one verification whose result every worker writes, a dead worker's
trial measured again, a worker of another kind refused, the password never shown.

The server is Debian's, started by ``tests/postgres.py`` in a temporary folder and reachable
only through a Unix socket there.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune import pipeline
from autotune.errors import UsageError
from autotune.report.console import Reporter
from autotune.search import shared
from autotune.search.study import database_storage, shown_url, study_lock
from autotune.search.tuner import retry_stale
from autotune.task import load_task
from autotune.trials.protocol import StudyAttr

from doubles import StandInRunner, recorded_machine
from helpers import MODELS, machine_doc, pinned_allocator, trial_measuring, written_document
from postgres import PASSWORD, running_server

# One xdist worker runs this module: its module fixture runs once (README: pytest -n 2).
pytestmark = pytest.mark.xdist_group("shared_study")


@pytest.fixture(scope="module")
def database() -> str:
    with running_server() as url:
        yield url
        for storage in _STORAGES.values():
            storage.engine.dispose()
        _STORAGES.clear()


_STORAGES: dict[str, optuna.storages.RDBStorage] = {}


def storage_of(url: str) -> optuna.storages.RDBStorage:
    """One storage (one pool of connections) per database for the tests' own reads: a new
    one per look would hold its connections until collected, and the server has a limit."""
    if url not in _STORAGES:
        _STORAGES[url] = database_storage(url, heartbeat_s=1, on_stale=retry_stale)
    return _STORAGES[url]


def open_shared(url: str, name: str) -> optuna.Study:
    return optuna.load_study(study_name=name, storage=storage_of(url))


def everything_written(*folders: Path) -> str:
    """Every text file under ``folders``, concatenated (to look for the password in)."""
    texts = []
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.suffix in (".json", ".md", ".html", ".sh", ".py", ".log", ".txt", ""):
                texts.append(path.read_text(errors="replace"))
    return "\n".join(texts)


# --- what a study is for -------------------------------------------------------------------

def test_a_workers_identity_read_back_from_the_study_names_each_difference_and_none_where_it_matches(tmp_path):
    from autotune.probes import fingerprint
    from autotune.search.shared import StudyIdentity

    model = tmp_path / "model.py"
    model.write_text("# a model file\n")
    space = {"included": {"batch_size": (16, 32)}, "fixed": {}, "excluded": {}}
    mine = StudyIdentity.of(fingerprint=fingerprint(machine_doc()), model_file=model, space=space)
    stored = StudyIdentity.from_json(json.loads(json.dumps(mine.to_json())))  # as the study keeps it
    assert stored == mine and stored.differences(mine) == []
    model.write_text("# another model file\n")
    other = StudyIdentity.of(fingerprint={**fingerprint(machine_doc()), "usable_cores": 64}, model_file=model,
                             space={**space, "included": {"batch_size": [16, 64]}})
    found = stored.differences(other)
    assert [line.split(":")[0] for line in found] == ["machine", "model file", "search space (included) batch_size"]
    assert "usable_cores" in found[0] and "model.py" in found[1] and "[16, 64] here" in found[2]


# --- the URL, the driver, the database ------------------------------------------------------

def test_the_password_is_masked_wherever_the_url_is_shown():
    assert shown_url("postgresql://me:hunter2@db.example/tune") == "postgresql://me:***@db.example/tune"
    assert "hunter2" not in shown_url("hunter2")  # not a URL at all: not echoed


def test_a_database_that_is_not_postgresql_is_refused_saying_what_to_give(tmp_path):
    with pytest.raises(UsageError, match="sqlite URL; a shared study lives in PostgreSQL"):
        database_storage(f"sqlite:///{tmp_path}/s.db", heartbeat_s=1, on_stale=retry_stale)


def test_a_missing_driver_names_the_extra_to_install(monkeypatch):
    from autotune.search import study

    monkeypatch.setattr(study, "_importable", lambda module: False)
    with pytest.raises(UsageError, match=r"pip install 'autotune\[postgres\]'") as err:
        database_storage("postgresql://me:hunter2@localhost/tune", heartbeat_s=1, on_stale=retry_stale)
    assert "hunter2" not in str(err.value)


def test_an_unreachable_database_is_named_without_its_password(tmp_path):
    url = f"postgresql://me:hunter2@/tune?host={tmp_path}/no-server-here"
    with pytest.raises(UsageError, match="cannot be used") as err:
        database_storage(url, heartbeat_s=1, on_stale=retry_stale)
    assert "hunter2" not in str(err.value) and "me:***@" in str(err.value)


@pytest.mark.slow
def test_workers_starting_together_on_a_new_database_all_open_it(database):
    """Optuna creates its tables in a new database: workers that start at once must not
    collide doing so (PostgreSQL refuses a second CREATE of the same type). Four workers
    on each of four new databases: without the lock most databases lose one."""
    import sqlalchemy

    # Each worker imports, says so, and opens its database once told to go: every worker
    # of every database opens at the same moment, whatever the imports cost.
    code = ("import sys; from autotune.search.study import database_storage\n"
            "from autotune.search.tuner import retry_stale\n"
            "print('ready', flush=True); sys.stdin.readline()\n"
            "database_storage(sys.argv[1], heartbeat_s=1, on_stale=retry_stale); print('opened')")
    engine = sqlalchemy.create_engine(database, isolation_level="AUTOCOMMIT")
    workers = []
    for n in range(4):
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text(f"CREATE DATABASE fresh{n}"))
        fresh = database.replace("@/postgres?", f"@/fresh{n}?")
        workers += [subprocess.Popen([sys.executable, "-c", code, fresh], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                    for _ in range(4)]
    engine.dispose()
    for w in workers:
        assert w.stdout.readline().strip() == "ready", w.communicate(timeout=60)[1][-2000:]
    for w in workers:
        w.stdin.write("go\n")
        w.stdin.flush()
    results = [w.communicate(timeout=120) for w in workers]
    for w, (out, err) in zip(workers, results):
        assert w.returncode == 0 and out.strip() == "opened", err[-2000:]
        assert PASSWORD not in err


# --- workers of one study, in this process, on recorded machines ------------------------------

def run_worker(url: str, name: str, out: Path, *, machine: str = "avx2_epyc",
               model: str = "knob_cnn.py", trials: int = 6) -> tuple[dict, StandInRunner]:
    runner = StandInRunner(recorded_machine(machine))
    out.mkdir(parents=True, exist_ok=True)
    options = pipeline.RunOptions(trials=trials, storage=url, study=name, heartbeat_s=1, verify_wait_s=30)
    pipeline.execute(load_task(MODELS / model), out, options, machine=runner.doc, runner=runner,
                     reporter=Reporter(quiet=True))
    return written_document(out), runner


def test_a_second_worker_shares_the_budget_and_writes_the_first_ones_verified_result(database, tmp_path):
    first, first_runner = run_worker(database, "shared-budget", tmp_path / "a")
    second, second_runner = run_worker(database, "shared-budget", tmp_path / "b")
    study = open_shared(database, "shared-budget")
    roles = [t.user_attrs.get(StudyAttr.ROLE) for t in study.trials]
    assert roles.count("baseline") == 1, "the start was enqueued by each worker"
    measured = [t for t in study.trials if "result" in t.user_attrs]
    assert len(measured) == 6, "the budget is the study's: the second worker measured nothing more"
    assert second_runner.measured == [], "the second worker measured although the budget was spent"
    assert first_runner.scripts, "the first worker did not verify"
    assert not second_runner.scripts and not second_runner.gated, "verification ran twice"
    assert second == first, "the workers wrote different results"
    assert first["search"]["study"] == "shared-budget"
    assert first["search"]["storage"] == shown_url(database)
    assert PASSWORD not in everything_written(tmp_path / "a", tmp_path / "b")


def test_a_worker_of_another_machine_or_model_is_refused_naming_the_difference(database, tmp_path):
    run_worker(database, "refusing", tmp_path / "a", trials=3)
    with pytest.raises(UsageError, match="cannot join the study 'refusing': machine: .*cpu_model"):
        run_worker(database, "refusing", tmp_path / "b", machine="amx_spr", trials=3)
    with pytest.raises(UsageError, match="model file: knob_cnn.py .* in the study, tiny_cnn.py"):
        run_worker(database, "refusing", tmp_path / "c", model="tiny_cnn.py", trials=3)
    assert not (tmp_path / "b" / "best_config.json").exists()


def test_a_worker_waits_for_the_verification_another_one_holds(database):
    storage = storage_of(database)
    study = optuna.create_study(study_name="waiting", storage=storage)
    held, publish = threading.Event(), threading.Event()

    def other_worker():
        with study_lock(storage, "waiting:verify"):
            held.set()
            publish.wait(10)
            study.set_user_attr(StudyAttr.PUBLISHED, {"verified": "by the other"})

    other = threading.Thread(target=other_worker)
    other.start()
    held.wait(10)
    notices: list[str] = []
    threading.Timer(1.0, publish.set).start()
    result, here = shared.verify_once(study, storage, lock_name="waiting:verify", wait_s=30, poll_s=0.2,
                                      notice=notices.append,
                                      verify=lambda: pytest.fail("verified twice"))
    other.join()
    assert (result, here) == ({"verified": "by the other"}, False)
    assert notices and "another worker is verifying" in notices[0]


@pytest.mark.slow
def test_a_waiting_worker_verifies_when_the_verifier_dies(database):
    """The verification lock is the verifier's database session: a killed verifier's
    ends with its process, and the worker that waited verifies instead."""
    storage = storage_of(database)
    study = optuna.create_study(study_name="verifier-dies", storage=storage)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.path[:0] = sys.argv[1:2]\n"
         "from autotune.search.study import database_storage, study_lock\n"
         "from autotune.search.tuner import retry_stale\n"
         "with study_lock(database_storage(sys.argv[2], heartbeat_s=1, on_stale=retry_stale), sys.argv[3]):\n"
         "    print('held', flush=True); time.sleep(600)",
         str(Path(__file__).parent), database, "verifier-dies:verify"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        threading.Timer(1.5, holder.kill).start()
        result, here = shared.verify_once(study, storage, lock_name="verifier-dies:verify", wait_s=60,
                                          poll_s=0.2, notice=lambda text: None,
                                          verify=lambda: {"verified": "here"})
    finally:
        holder.kill()
        holder.wait()
    assert (result, here) == ({"verified": "here"}, True)
    assert study.user_attrs[StudyAttr.PUBLISHED] == {"verified": "here"}


def test_a_worker_waits_no_longer_than_it_is_told(database):
    storage = storage_of(database)
    study = optuna.create_study(study_name="too-long", storage=storage)
    with study_lock(storage, "too-long:verify"):
        with pytest.raises(shared.WaitedTooLong, match="--verify-wait"):
            shared.verify_once(study, storage, lock_name="too-long:verify", wait_s=0.5, poll_s=0.1,
                               notice=lambda text: None, verify=lambda: pytest.fail("lock ignored"))


# --- real autotune processes on this machine ------------------------------------------------

BUDGET = 4  # the study's trials, whichever worker measures them
CLI_ARGS = [
    "--trials", str(BUDGET), "--window", "0.2", "--windows", "2", "--rounds", "2", "--top", "1",
    "--pairs", "2", "--pair-seconds", "0.5", "--trial-timeout", "120", "--heartbeat", "1", "--no-profile",
    "--fix", "nprocs=1", "--fix", "compile=off", f"--fix=allocator={pinned_allocator()}",
    "--fix", "affinity=none", "--fix", "interop_threads=none", "--fix", "precision=fp32",
]


def worker_command(out: Path, study: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "autotune", "run", str(MODELS / "tiny_cnn.py"), "--out", str(out),
            "--study", study, *CLI_ARGS, *extra]


def worker_env(url: str) -> dict[str, str]:
    # the URL through the environment, as a user keeps a password off the command line
    return {**os.environ, "AUTOTUNE_STORAGE": url, "COLUMNS": "200"}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_two_worker_processes_tune_one_study_and_emit_the_same_verified_result(database, tmp_path):
    procs = [subprocess.Popen(worker_command(tmp_path / name, "two-workers"), cwd=tmp_path,
                              env=worker_env(database), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, stdin=subprocess.DEVNULL)
             for name in ("a", "b")]
    outputs = [p.communicate(timeout=540) for p in procs]
    for p, (stdout, stderr) in zip(procs, outputs):
        assert p.returncode in (0, 3), stderr[-4000:]
        assert PASSWORD not in stdout + stderr
    study = open_shared(database, "two-workers")
    measured = [t for t in study.trials if "result" in t.user_attrs]
    assert len(measured) == BUDGET, f"{len(measured)} trials measured: the budget of {BUDGET} is the study's"
    roles = [t.user_attrs.get(StudyAttr.ROLE) for t in study.trials]
    starts = [sorted(t.params.items()) for t in study.trials if t.user_attrs.get(StudyAttr.ROLE) == "heuristic"]
    assert roles.count("baseline") == 1 and starts, roles
    assert all(starts.count(s) == 1 for s in starts), "each worker queued the start"
    logs = {name: {p.name for p in (tmp_path / name / "trials").glob("trial-*")}
            for name in ("a", "b") if (tmp_path / name / "trials").is_dir()}
    assert len(logs) == 2, "one worker measured every trial: they did not share the study"
    assert not (logs["a"] & logs["b"]), "a trial was measured by both workers"
    # One worker verified (with candidates, it says so; a search of 4 trials may leave none)
    # and the other took its result.
    waited = [stderr for _, stderr in outputs if "another worker of the study verified" in stderr]
    assert len(waited) == 1, "not one worker verified and the other took its result"
    assert "candidates against the baseline" not in waited[0], "the worker that took the result verified too"
    assert StudyAttr.PUBLISHED in study.user_attrs
    a, b = (written_document(tmp_path / name) for name in ("a", "b"))
    assert a == b, "the two workers emitted different results"
    assert PASSWORD not in everything_written(tmp_path / "a", tmp_path / "b")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_worker_killed_mid_trial_leaves_the_study_completable_by_another(database, tmp_path):
    name = "killed-worker"
    # The batch size is fixed too: a larger batch is the one knob that makes tiny_cnn clearly
    # faster, and a candidate found faster takes the second worker through every stage of
    # the verification (ablation, standalone pairs), which this test is not about and
    # which the two-worker test above runs.
    fixed = ("--fix", "batch_size=16")
    with open(tmp_path / "first.log", "w") as log:
        first = subprocess.Popen(worker_command(tmp_path / "a", name, *fixed), cwd=tmp_path, env=worker_env(database),
                                 stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while True:
            assert first.poll() is None, "the worker ended before it could be killed:\n" + (
                tmp_path / "first.log").read_text()
            assert time.monotonic() < deadline, "no trial was measuring after one had finished"
            try:
                trials = open_shared(database, name).trials
            except KeyError:  # the study is not created yet
                trials = []
            done = [t for t in trials if t.state == TrialState.COMPLETE]
            if done and trial_measuring(trials, tmp_path / "a"):
                break
            time.sleep(0.1)
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    killed = {t.number: t for t in open_shared(database, name).trials}
    completed_before = {n for n, t in killed.items() if t.state == TrialState.COMPLETE}
    left_running = [n for n, t in killed.items() if t.state == TrialState.RUNNING]
    assert left_running, "the killed worker's trial was not left running"

    second = subprocess.run(worker_command(tmp_path / "b", name, *fixed), cwd=tmp_path, env=worker_env(database),
                            capture_output=True, text=True, timeout=500, stdin=subprocess.DEVNULL)
    assert second.returncode in (0, 3), second.stderr[-4000:]
    after = {t.number: t for t in open_shared(database, name).trials}
    assert {n for n in completed_before if after[n].state == TrialState.COMPLETE} == completed_before, (
        "a completed trial was lost")
    for number in left_running:
        assert after[number].state == TrialState.FAIL, "the dead worker's trial still counts as running"
        retries = [t for t in after.values() if t.user_attrs.get(StudyAttr.RETRY)
                   and t.params == after[number].params]
        assert retries and retries[0].state.is_finished(), "the dead worker's trial was not measured again"
    measured = [t for t in after.values() if "result" in t.user_attrs]
    assert len(measured) == BUDGET, "the dead worker's trial cost budget, or the budget was overspent"
    assert (tmp_path / "b" / "best_config.json").is_file()
    assert json.loads((tmp_path / "b" / "best_config.json").read_text())["search"]["study"] == name


# --- looking at a shared study ----------------------------------------------------------------

def test_the_dashboard_of_a_folder_whose_study_is_shared_asks_for_its_url(tmp_path, capsys):
    from autotune.cli import main

    (tmp_path / "best_config.json").write_text(json.dumps(
        {"search": {"storage": "postgresql://me:***@db/tune", "study": "s"}}))
    assert main(["dashboard", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "shared in postgresql://me:***@db/tune: give its URL with --storage" in err


@pytest.mark.slow
def test_the_dashboard_serves_a_shared_study_on_loopback_without_showing_the_password(database, tmp_path):
    import socket
    import urllib.request

    pytest.importorskip("optuna_dashboard", reason="the dashboard extra is not installed")
    from test_listeners import beyond_loopback, listening

    optuna.create_study(study_name="dashboard", storage=storage_of(database)).optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "dashboard", str(tmp_path), "--port", str(port)],
                            env=worker_env(database), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not listening(proc.pid) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        seen = listening(proc.pid)
        assert seen and not beyond_loopback(seen), seen
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=10) as r:
            assert '"dashboard"' in r.read().decode()
    finally:
        proc.kill()
        out = proc.communicate()[0].decode()
    assert "serving postgresql+psycopg://autotune:***@" in out and PASSWORD not in out
