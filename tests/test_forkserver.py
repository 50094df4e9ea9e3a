"""Trials forked from a warm interpreter (``autotune.trials.forkserver``): a forked process
starts as a fresh one would (its own session, streams, folder, environment and arguments,
torch already imported), its exit code comes back as Popen's would, a trial measured in one
is the runner's own, and a SIGKILL of whoever owns the servers leaves nothing running."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest

from autotune.config import TrialConfig
from autotune.trials.forkserver import ForkServers, preload, server_environment
from autotune.trials.protocol import Measurement, Status

from helpers import MODELS, machine_doc, survivors

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("forkserver")]

REPORTS = """\
import json, os, sys, tempfile, threading
already = sorted(m for m in ("torch", "torch._dynamo") if m in sys.modules)
print("to the log")
print("to stderr", file=sys.stderr)
json.dump({"argv": sys.argv, "orig_argv": sys.orig_argv, "cwd": os.getcwd(), "sid": os.getsid(0),
           "pid": os.getpid(), "env": dict(os.environ), "tmp": tempfile.gettempdir(), "already": already,
           "stdin": sys.stdin.read(), "threads": threading.active_count(),
           "cmdline": open("/proc/self/cmdline").read().replace(chr(0), " ").strip()},
          open(sys.argv[1], "w"))
sys.exit(int(sys.argv[2]))
"""


def test_a_forked_process_starts_as_a_fresh_one_would_less_the_imports(tmp_path):
    (tmp_path / "reports_itself.py").write_text(REPORTS)
    work = tmp_path / "work"
    work.mkdir()
    servers = ForkServers(folder=tmp_path / "servers")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "TMPDIR": str(work), "AUTOTUNE_TRIAL_DIR": str(work), "MARKER": "one"}
    try:
        seen = []
        for i, marker in enumerate(("one", "two")):
            proc = servers.spawn("reports_itself", [str(tmp_path / f"r{i}.json"), str(3 + i)],
                                 env={**env, "MARKER": marker}, cwd=work, log=tmp_path / f"log{i}.txt")
            assert proc.wait(timeout=60) == 3 + i  # its exit code, as Popen's returncode
            seen.append(json.loads((tmp_path / f"r{i}.json").read_text()))
        assert seen[1]["env"]["MARKER"] == "two"  # each its own environment: MARKER is read after the start
        assert len(list((tmp_path / "servers").glob("forkserver-*.log"))) == 2  # ... but the server's differ
        for i, r in enumerate(seen):
            assert r["already"] == ["torch", "torch._dynamo"]  # imported by the server, not by it
            assert r["argv"][1:] == [str(tmp_path / f"r{i}.json"), str(3 + i)]
            assert r["orig_argv"][1:3] == ["-m", "reports_itself"]
            assert r["cmdline"] == " ".join(r["orig_argv"])  # what ps shows: its own, not the server's
            assert r["cwd"] == str(work) and r["tmp"] == str(work)  # TMPDIR read afresh
            assert r["sid"] == r["pid"]  # a session of its own
            assert r["stdin"] == "" and r["threads"] == 1
            assert {k: v for k, v in r["env"].items()} == {**env, "MARKER": r["env"]["MARKER"]}
            log = (tmp_path / f"log{i}.txt").read_text()
            assert "to the log" in log and "to stderr" in log
    finally:
        servers.close()
    assert survivors(str(tmp_path / "servers")) == []


ADOPTED = """\
import faulthandler, json, os, sys
from torch._inductor.runtime.cache_dir_utils import cache_dir
json.dump({"parent": os.getppid(), "faulthandler": faulthandler.is_enabled(), "inductor_cache": cache_dir()},
          open(sys.argv[1], "w"))
"""


def test_a_runs_trials_fork_from_the_interpreter_its_check_warmed(tmp_path):
    """``adopt``: the servers a run's check started (``forkserver.shared``) become its trials';
    a trial whose environment is the check's but for what a process reads once it has started
    (faulthandler, inductor's cache folder) forks from the check's server, and gets both."""
    (tmp_path / "adopted.py").write_text(ADOPTED)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "TMPDIR": str(work)}
    for name in ("PYTHONFAULTHANDLER", "TORCHINDUCTOR_CACHE_DIR"):
        env.pop(name, None)
    check, trials = ForkServers(folder=tmp_path / "check"), ForkServers(folder=tmp_path / "trials")
    try:
        assert check.spawn("adopted", [str(tmp_path / "check.json")], env=env, cwd=work,
                           log=tmp_path / "check.log").wait(timeout=120) == 0
        [warmed] = check.pids()
        elsewhere = ForkServers(folder=tmp_path / "elsewhere", python=f"{sys.executable}-another")
        elsewhere.adopt(check)  # trials run by another interpreter
        assert elsewhere.pids() == [] and check.pids() == [warmed]
        trials.adopt(check)
        assert check.pids() == [] and trials.pids() == [warmed]
        cache = tmp_path / "out" / "compile-cache"
        trial = trials.spawn("adopted", [str(tmp_path / "trial.json")], cwd=work, log=tmp_path / "trial.log",
                             env={**env, "PYTHONFAULTHANDLER": "1", "TORCHINDUCTOR_CACHE_DIR": str(cache)})
        assert trial.wait(timeout=60) == 0
        seen = json.loads((tmp_path / "trial.json").read_text())
        assert seen == {"parent": warmed, "faulthandler": True, "inductor_cache": str(cache)}
        assert not (tmp_path / "trials").exists()  # no server of its own
        assert json.loads((tmp_path / "check.json").read_text())["faulthandler"] is False
    finally:
        check.close()
        trials.close()
    assert survivors(str(tmp_path / "check")) == []


def test_the_server_imports_the_frameworks_a_script_needs():
    assert preload(None) == ("torch", "torch._dynamo", "autotune.trials.worker")
    assert preload("transformers")[-2:] == ("transformers", "transformers.trainer")
    assert preload("lightning")[-1] == "lightning"
    # what a process reads only once it has started: not a server's environment
    assert server_environment({"TMPDIR": "/t", "AUTOTUNE_TRIAL_DIR": "/d", "OMP_NUM_THREADS": "1",
                               "PYTHONFAULTHANDLER": "1", "TORCHINDUCTOR_CACHE_DIR": "/c"}) == {
        "OMP_NUM_THREADS": "1"}


OWNER = """\
import sys, time
from pathlib import Path
from autotune.trials.forkserver import ForkServers
servers = ForkServers(folder=Path(sys.argv[1]))
import os
proc = servers.spawn("sleeps", [], env={**os.environ, "PYTHONPATH": sys.argv[2] + ":" + os.environ.get("PYTHONPATH", "")},
                     cwd=Path(sys.argv[2]), log=Path(sys.argv[1]) / "sleeps.log")
print(proc.pid, flush=True)
time.sleep(600)
"""


def test_a_sigkill_of_the_owner_ends_the_server_and_what_it_forked(tmp_path):
    (tmp_path / "sleeps.py").write_text("import time\ntime.sleep(600)\n")
    (tmp_path / "owner.py").write_text(OWNER)
    owner = subprocess.Popen([sys.executable, str(tmp_path / "owner.py"), str(tmp_path / "servers"), str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    try:
        forked = int(owner.stdout.readline())
        server = psutil.Process(forked).ppid()
        assert "autotune.trials.warm_interpreter" in " ".join(psutil.Process(server).cmdline())
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        gone, alive = psutil.wait_procs([psutil.Process(server), psutil.Process(forked)], timeout=10)
        assert not alive, [p.pid for p in alive]
    finally:
        if owner.poll() is None:
            owner.kill()
    assert survivors(str(tmp_path)) == []


def test_a_trial_runs_in_a_forked_process_and_measures(tmp_path):
    """The runner's trial process is forked from the warm interpreter (its parent is the
    server, torch was imported before the model file), its knobs set inside it as a fresh
    one's are, and its result is the runner's as before."""
    from autotune.trials.runner import TrialRunner

    model = tmp_path / "model.py"
    model.write_text(textwrap.dedent(f"""\
        import json, os, sys
        import psutil
        _seen = {{"dynamo_before": "torch._dynamo" in sys.modules,
                 "parent": " ".join(psutil.Process(os.getppid()).cmdline()),
                 "omp": os.environ.get("OMP_NUM_THREADS")}}
        exec(open({str(MODELS / 'tiny_cnn.py')!r}).read())
        _build_model = build_model
        def build_model():
            import torch
            _seen["threads"] = torch.get_num_threads()
            json.dump(_seen, open({str(tmp_path / 'seen.json')!r}, "w"))
            return _build_model()
        """))
    runner = TrialRunner(model_file=model, machine=machine_doc(), workdir=tmp_path / "trials",
                         measurement=Measurement(window_s=0.2, windows=2), warm=False)
    try:
        result = runner.run(TrialConfig(threads=1), name="t")
        assert result.status == Status.OK and result.value, result.describe_failure()
        seen = json.loads((tmp_path / "seen.json").read_text())
        assert seen["dynamo_before"] and "autotune.trials.warm_interpreter" in seen["parent"], seen
        assert seen["omp"] == "1" and seen["threads"] == 1
        fresh = TrialRunner(model_file=model, machine=machine_doc(), workdir=tmp_path / "fresh",
                            measurement=Measurement(window_s=0.2, windows=2), warm=False, fork=False)
        assert fresh.run(TrialConfig(threads=1), name="t").status == Status.OK
        seen = json.loads((tmp_path / "seen.json").read_text())
        assert not seen["dynamo_before"] and "autotune.trials.warm_interpreter" not in seen["parent"]
    finally:
        runner.shutdown()
    assert survivors(str(tmp_path / "trials")) == []


def test_a_server_whose_imports_loaded_the_cuda_driver_refuses_to_fork(tmp_path):
    """A forked process could not use CUDA once its parent loaded the driver: the server
    says why, and the caller starts the process fresh (``ForkServerError``)."""
    import shutil

    from autotune.trials.forkserver import ForkServer, ForkServerError

    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a C compiler to build a stand-in libcuda.so")
    (tmp_path / "empty.c").write_text("int stand_in;\n")
    subprocess.run([compiler, "-shared", "-o", str(tmp_path / "libcuda.so.1"), str(tmp_path / "empty.c")], check=True)
    (tmp_path / "loads_cuda.py").write_text(f"import ctypes\nctypes.CDLL({str(tmp_path / 'libcuda.so.1')!r})\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    server = ForkServer(env=env, cwd=tmp_path, modules=("loads_cuda",), label=str(tmp_path), log=tmp_path / "s.log")
    try:
        with pytest.raises(ForkServerError, match="the CUDA driver was loaded"):
            server.spawn("loads_cuda", [], env=env, cwd=tmp_path, log=tmp_path / "child.log")
    finally:
        server.close()


def test_a_server_whose_processes_still_run_is_not_ended_to_make_room(tmp_path, monkeypatch):
    """Configurations held side by side in verification run at once, each forked from the
    server of its environment: past the servers kept, an idle one ends, never one whose
    process runs (ending it would end that process, the parent-death signal)."""
    from autotune.trials import forkserver

    monkeypatch.setattr(forkserver, "MAX_SERVERS", 1)
    (tmp_path / "sleeps.py").write_text("import time\ntime.sleep(600)\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    servers = ForkServers(folder=tmp_path / "servers")
    try:
        held = [servers.spawn("sleeps", [], env={**env, "OMP_NUM_THREADS": str(n)}, cwd=tmp_path,
                              log=tmp_path / f"{n}.log") for n in (1, 2)]
        assert [p.poll() for p in held] == [None, None]  # both run: the first's server was kept
        held[0].kill()
        assert held[0].wait(timeout=30) == -signal.SIGKILL
        third = servers.spawn("sleeps", [], env={**env, "OMP_NUM_THREADS": "3"}, cwd=tmp_path,
                              log=tmp_path / "3.log")
        assert held[1].poll() is None and third.poll() is None
        assert len(servers._servers) == 2  # the idle first one ended, the busy second kept
    finally:
        servers.close()
    assert survivors(str(tmp_path / "servers")) == []
