"""Nothing autotune starts listens beyond loopback: ranks of a trial and of the emitted
launch.sh meet through a file store and talk over the loopback interface (torchrun
--standalone's TCP stores listen on every interface)."""
from __future__ import annotations

import ipaddress
import subprocess
import time

import psutil
import pytest

from autotune.config import TrialConfig
from autotune.emit import outputs as emit
from autotune.trials import launch
from autotune.trials.runner import Measurement, TrialRunner
from autotune.trials.spec import TrialMode

from helpers import MODELS, machine_doc

TWO_RANKS = TrialConfig(nprocs=2, threads=1, batch_size=16)


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every listening inet socket of ``pid`` and its descendants."""
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return set()
    found = set()
    for p in procs:
        try:
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN:
                    found.add((c.laddr.ip, c.laddr.port))
        except psutil.Error:
            pass
    return found


def beyond_loopback(sockets: set[tuple[str, int]]) -> set[tuple[str, int]]:
    return {s for s in sockets if not ipaddress.ip_address(s[0].split("%")[0]).is_loopback}


@pytest.mark.slow
def test_a_two_rank_trial_listens_on_loopback_only(tmp_path):
    runner = TrialRunner(model_file=MODELS / "tiny_cnn.py", machine=machine_doc(),
                         workdir=tmp_path, measurement=Measurement(warmup_steps=2, window_s=0.3),
                         timeout_s=120)
    trial = runner.start(TWO_RANKS, name="serve", mode=TrialMode.serve())
    seen: set[tuple[str, int]] = set()
    try:
        while not trial.poll() and not trial.ready:  # setup, rendezvous, warm-up
            seen |= listening(trial.proc.pid)
            time.sleep(0.05)
        assert trial.ready, f"{trial.result.describe_failure()}\n{trial.result.log_tail}"
        for _ in range(3):
            seen |= listening(trial.proc.pid)
            assert trial.window() is not None
            seen |= listening(trial.proc.pid)
    finally:
        trial.kill()
    assert seen, "no listening socket was seen at all: the poll did not observe the ranks"
    assert not beyond_loopback(seen), seen


@pytest.mark.slow
def test_the_emitted_two_rank_launch_sh_listens_on_loopback_only(tmp_path):
    env, _ = launch.environment(TWO_RANKS, machine=machine_doc())
    out = tmp_path / "out"
    emit.write_candidate(out, cfg=TWO_RANKS, model_file=MODELS / "tiny_cnn.py", env=env,
                         description="two ranks")
    proc = subprocess.Popen(["bash", str(out / "launch.sh"), "--max-steps", "150",
                             "--no-checkpoint"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    seen: set[tuple[str, int]] = set()
    try:
        while proc.poll() is None:
            seen |= listening(proc.pid)
            time.sleep(0.05)
        output = proc.stdout.read()
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, output[-3000:]
    assert "step 150/150" in output
    assert seen, "no listening socket was seen at all: the poll did not observe the ranks"
    assert not beyond_loopback(seen), seen


@pytest.mark.slow
def test_the_dashboard_listens_on_loopback_only(tmp_path):
    """`autotune dashboard` serves the study on 127.0.0.1 unless told otherwise."""
    import socket
    import sys
    import urllib.request

    pytest.importorskip("optuna_dashboard", reason="the dashboard extra is not installed")
    from autotune.search.tuner import open_study

    open_study(storage_path=tmp_path / "study.journal", study_name="s").optimize(
        lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "dashboard", str(tmp_path),
                             "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not listening(proc.pid) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        seen = listening(proc.pid)
        assert seen, proc.stdout.read().decode() if proc.poll() is not None else "not listening"
        assert not beyond_loopback(seen), seen
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=10) as r:
            assert "study_name" in r.read().decode()
    finally:
        proc.kill()
        proc.wait()
