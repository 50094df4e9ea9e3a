"""The tuned result on several nodes: launch.sh (and torchrun.sh) take their node's place
in a job of N nodes, each node running the tuned layout of one under torchrun; the global
batch is N x the tuned one; a lost node ends the job; sbatch.sh runs launch.sh on every
node of a Slurm job. Two "nodes" here are two agents on this machine, over loopback."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from autotune.config import TrialConfig
from autotune.emit import outputs as emit
from autotune.emit import slurm
from autotune.emit import stacks as stack_configs
from autotune.runtime import nodes
from autotune.runtime.main import batch_note
from autotune.trials import launch

from helpers import MODELS, emit_outputs, machine_doc, run_document, run_launch_sh, survivors

TINY = MODELS / "tiny_cnn.py"
TRAIN = ("--max-steps", "3", "--log-every", "1", "--no-checkpoint", "--report", "r.json")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_args(nnodes: int, node_rank: int, endpoint: str) -> list[str]:
    """launch.sh's arguments on one node of a job: the command sbatch.sh's srun line runs."""
    return ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--rdzv-endpoint", endpoint]


class Node:
    """One node's launch.sh, started from its own folder, its output read as it comes."""

    def __init__(self, out: Path, cwd: Path, env: dict[str, str], *args: str) -> None:
        cwd.mkdir(parents=True, exist_ok=True)
        self.cwd = cwd
        self.proc = subprocess.Popen(["bash", str(out / "launch.sh"), *args], cwd=cwd, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.out: list[str] = []
        self.err: list[str] = []
        self._readers = [threading.Thread(target=self._read, args=(stream, into), daemon=True)
                         for stream, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for t in self._readers:
            t.start()

    @staticmethod
    def _read(stream, into: list[str]) -> None:
        for line in stream:
            into.append(line)

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        for t in self._readers:
            t.join(timeout=10)
        return code

    def text(self) -> str:
        return "".join(self.out) + "".join(self.err)


def two_nodes(out: Path, root: Path, env: dict[str, str], *train: str) -> list[Node]:
    """launch.sh on node 0 and node 1 of a two-node job, both on this machine (over lo)."""
    endpoint = f"127.0.0.1:{free_port()}"
    # torchrun's log folders go there: a SIGKILLed agent cannot remove its own
    tmp = root / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    return [Node(out, root / f"node{r}", {**env, "TMPDIR": str(tmp)}, *node_args(2, r, endpoint), "--iface", "lo",
                 *train)
            for r in (0, 1)]


def finish(started: list[Node], timeout: float = 90) -> None:
    try:
        for node in started:
            code = node.wait(timeout)
            assert code == 0, node.text()[-4000:]
    finally:
        for node in started:
            if node.proc.poll() is None:
                node.proc.kill()


def rank0_report(started: list[Node]) -> dict:
    """--report, written by global rank 0: on whichever node torchrun ranked first."""
    (path,) = [n.cwd / "r.json" for n in started if (n.cwd / "r.json").exists()]
    return json.loads(path.read_text())


# --- two nodes train as one node of both nodes' ranks ----------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("per_node", [2])
def test_two_nodes_train_the_losses_of_one_node_running_both_nodes_ranks(tmp_path, no_autotune_env, per_node):
    """Two nodes of the tuned layout (``per_node`` ranks, batch 16 x ``per_node``) against
    one node of twice the ranks and twice the batch: the same world, the same per-rank
    batch (16), the same global batch, and the GlobalBatchSampler gives rank r the r-th
    chunk of each global batch in both; DDP averages the same gradients over the same
    number of gloo ranks. Every operation is the same in fp32, so the losses are equal,
    bit for bit, not merely close. Two ranks per node hold both kinds of peer (on the node,
    across nodes); a node of one rank trains in the killed-agent test below."""
    node_cfg = TrialConfig(nprocs=per_node, threads=1, batch_size=16 * per_node)
    emit_outputs(tmp_path / "node", node_cfg, TINY)
    emit_outputs(tmp_path / "one", node_cfg.replace(nprocs=2 * per_node, batch_size=32 * per_node), TINY)
    started = two_nodes(tmp_path / "node", tmp_path / "two", no_autotune_env, *TRAIN)
    finish(started)
    proc = subprocess.run(["bash", str(tmp_path / "one" / "launch.sh"), *TRAIN], cwd=tmp_path,
                          env=no_autotune_env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = json.loads((tmp_path / "r.json").read_text())
    two = rank0_report(started)
    assert two["facts"]["world"] == 2 * per_node and two["facts"]["per_rank_batch"] == 16
    assert two["facts"]["env"]["GLOO_SOCKET_IFNAME"] == "lo"  # the interface named, on every rank
    assert two["losses"] == one["losses"] and len(two["losses"]) == 3
    for r, node in enumerate(started):
        err = "".join(node.err)
        assert f"launch.sh: node {r} of 2, rendezvous at 127.0.0.1:" in err
        assert "the ranks talk over lo (127.0.0.1)" in err
        assert "listen on every interface" in err  # torchrun's stores: said, never silent
    note = f"the global batch size {32 * per_node} (the tuned {16 * per_node} per node x 2 nodes)"
    assert note in "".join(started[0].err + started[1].err)


@pytest.mark.slow
def test_killing_one_nodes_agent_ends_the_other_node_with_a_clear_error(tmp_path, no_autotune_env):
    emit_outputs(tmp_path / "node", TrialConfig(threads=1, batch_size=16), TINY)
    started = two_nodes(tmp_path / "node", tmp_path, no_autotune_env,
                        "--max-steps", "1000000", "--log-every", "5", "--no-checkpoint")
    try:
        deadline = time.monotonic() + 60
        while not any("loss" in line for node in started for line in node.out):
            assert time.monotonic() < deadline and all(n.proc.poll() is None for n in started), \
                [n.text()[-2000:] for n in started]
            time.sleep(0.1)
        started[1].proc.send_signal(signal.SIGKILL)  # launch.sh exec'd torchrun: the agent itself
        code = started[0].wait(timeout=60)  # node 0 ends on its own rather than training on
    finally:
        for node in started:
            if node.proc.poll() is None:
                node.proc.kill()
    output = started[0].text()
    assert code != 0, (code, output[-3000:])
    assert "lost another rank of the job" in output, output[-3000:]
    # torchrun's own summary names the same line (its error file), not a link to its docs
    assert output.count("lost another rank of the job") >= 2, output[-3000:]
    # node 1's rank died with its agent rather than training on, orphaned
    assert survivors(str(tmp_path / "node")) == []


# --- launch.sh's node options, with a stand-in python ----------------------------------------

FAKE_PYTHON = f'''#!/bin/sh
# tuned_runtime/nodes.py runs for real; anything else prints what it was given
case "$1" in *nodes.py) exec {sys.executable} "$@" ;; esac
echo "ENV GLOO=${{GLOO_SOCKET_IFNAME-unset}} NCCL=${{NCCL_SOCKET_IFNAME-unset}} NPROCS=${{TUNED_NPROCS-unset}}"
for a in "$@"; do echo "ARG=$a"; done
'''


@pytest.fixture
def fake_python(tmp_path) -> dict[str, str]:
    path = tmp_path / "fake-python"
    path.write_text(FAKE_PYTHON)
    path.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}
    return {**env, "PYTHON": str(path)}


def run_script(script: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], env=env, capture_output=True, text=True, timeout=60)


def argv_of(proc: subprocess.CompletedProcess) -> list[str]:
    return [line[4:] for line in proc.stdout.splitlines() if line.startswith("ARG=")]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


@pytest.mark.parametrize(("args", "message"), [
    (["--nnodes", "0"], "--nnodes must be a positive integer, not 0"),
    (["--nnodes", "two"], "--nnodes must be a positive integer, not two"),
    (["--nnodes", "2"], "--rdzv-endpoint HOST:PORT is needed with --nnodes 2"),
    (["--nnodes", "2", "--rdzv-endpoint", "node-a"], "--rdzv-endpoint must be HOST:PORT, not node-a"),
    (["--nnodes", "2", "--rdzv-endpoint", "node-a:70000"], "--rdzv-endpoint must be HOST:PORT, not node-a:70000"),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "a:1"], "--node-rank must be an integer from 0 to 1, not 2"),
    (["--nnodes", "2", "--node-rank", "-1", "--rdzv-endpoint", "a:1"], "--node-rank must be an integer from 0 to 1"),
    (["--nnodes", "2", "--rdzv-endpoint", "a:1", "--max-restarts", "x"], "--max-restarts must be a non-negative"),
    (["--epochs", "1", "--node-rank"], "--node-rank needs a value"),
])
def test_bad_node_arguments_exit_2_naming_the_argument(tmp_path, fake_python, args, message):
    emit_outputs(tmp_path / "out", TrialConfig(threads=1, batch_size=16), TINY)
    proc = run_script(tmp_path / "out" / "launch.sh", fake_python, *args)
    assert proc.returncode == 2 and f"launch.sh: {message}" in proc.stderr, proc.stderr
    assert proc.stdout == ""  # nothing started


def test_one_node_is_unchanged_and_several_run_torchrun_on_the_named_interface(tmp_path, fake_python):
    cfg = TrialConfig(nprocs=2, threads=1, batch_size=32)
    emit_outputs(tmp_path / "out", cfg, TINY)
    script = tmp_path / "out" / "launch.sh"
    one = run_script(script, fake_python, "--epochs", "1")
    assert one.returncode == 0 and "ENV GLOO=lo NCCL=unset NPROCS=2" in one.stdout
    assert argv_of(one) == [str(tmp_path / "out" / "train_tuned.py"), "--epochs", "1"]
    same = run_script(script, {**fake_python, "NNODES": "1"}, "--nnodes", "1", "--epochs", "1")
    assert argv_of(same) == argv_of(one) and same.stdout == one.stdout
    # a rank another launcher left (Lightning's NODE_RANK), or a one-node srun step on the
    # job's fourth node, is no reason to refuse one node
    for env in ({"NODE_RANK": "3"}, {"SLURM_STEP_NUM_NODES": "1", "SLURM_NODEID": "3"}):
        left = run_script(script, {**fake_python, **env}, "--epochs", "1")
        assert left.returncode == 0 and left.stdout == one.stdout, left.stderr

    several = run_script(script, fake_python, *node_args(2, 0, "127.0.0.1:29555"), "--iface", "lo",
                         "--epochs", "1")
    assert several.returncode == 0, several.stderr
    assert "ENV GLOO=lo NCCL=unset NPROCS=unset" in several.stdout  # torchrun starts the ranks
    argv = argv_of(several)
    assert argv[:2] == ["-m", "torch.distributed.run"] and argv[-3:] == [
        str(tmp_path / "out" / "train_tuned.py"), "--epochs", "1"]
    assert (flag(argv, "--nnodes"), flag(argv, "--nproc-per-node"), flag(argv, "--rdzv-backend"),
            flag(argv, "--rdzv-endpoint"), flag(argv, "--max-restarts")) == ("2", "2", "c10d", "127.0.0.1:29555", "0")
    assert flag(argv, "--rdzv-conf") == "is_host=1" and flag(argv, "--local-addr") == "127.0.0.1"
    assert "launch.sh: node 0 of 2, rendezvous at 127.0.0.1:29555; the ranks talk over lo (127.0.0.1)" in several.stderr
    assert "torch offers no way to bind them to one" in several.stderr
    assert torch_store_listens_everywhere()  # what the note says, still true of this torch

    # the same through the variables a scheduler sets; node 1 joins, it does not host
    env = {**fake_python, "NNODES": "2", "NODE_RANK": "1", "RDZV_ENDPOINT": "127.0.0.1:29555",
           "TUNED_IFACE": "lo", "MAX_RESTARTS": "3", "RDZV_ID": "job-9"}
    joined = argv_of(run_script(script, env, "--epochs", "1"))
    assert (flag(joined, "--rdzv-conf"), flag(joined, "--max-restarts"), flag(joined, "--rdzv-id")) == (
        "is_host=0", "3", "job-9")


def torch_store_listens_everywhere() -> bool:
    """Whether torch's TCPStore server binds every interface whatever host it is given, as
    the c10d rendezvous creates it (its endpoint's host, multi_tenant): torchrun has no flag
    to change it, hence launch.sh's note. A torch that binds the host given makes it False."""
    import psutil

    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, multi_tenant=True)
    listening = {c.laddr.ip for c in psutil.Process().net_connections(kind="inet")
                 if c.status == psutil.CONN_LISTEN and c.laddr.port == store.port}
    return bool(listening & {"::", "0.0.0.0"})


def _another_interface() -> tuple[str, str] | None:
    """An interface of this machine other than loopback, with its address."""
    for name, addresses in nodes.interface_addresses().items():
        usable = [a for a in addresses if ":" not in a and not a.startswith("127.")]
        if usable and name != launch.loopback_interface():
            return name, usable[0]
    return None


def test_the_interface_is_the_one_named_else_the_one_towards_the_endpoint(tmp_path, fake_python):
    emit_outputs(tmp_path / "out", TrialConfig(device="cuda", nprocs=2, batch_size=32, backend="nccl"), TINY)
    script = tmp_path / "out" / "launch.sh"
    routed = run_script(script, fake_python, *node_args(2, 1, "127.0.0.1:29555"))
    assert "ENV GLOO=lo NCCL=lo" in routed.stdout, routed.stderr  # 127.0.0.1 is reached through lo
    other = _another_interface()
    if other is None:
        pytest.skip("this machine has no interface but loopback")
    name, address = other
    named = run_script(script, fake_python, *node_args(2, 1, "127.0.0.1:29555"), "--iface", name)
    assert f"ENV GLOO={name} NCCL={name}" in named.stdout, named.stderr
    assert flag(argv_of(named), "--local-addr") == address
    assert f"the ranks talk over {name} ({address})" in named.stderr
    # the user's own choice is kept, and said
    kept = run_script(script, {**fake_python, "GLOO_SOCKET_IFNAME": "lo"}, *node_args(2, 1, "127.0.0.1:29555"),
                      "--iface", name)
    assert "ENV GLOO=lo" in kept.stdout and f"keeping your GLOO_SOCKET_IFNAME=lo (chosen: {name})" in kept.stderr
    missing = run_script(script, fake_python, *node_args(2, 1, "127.0.0.1:29555"), "--iface", "no-such-if0")
    assert missing.returncode == 2 and "--iface no-such-if0: no such interface here" in missing.stderr


def test_a_hosts_own_name_on_loopback_is_refused_not_used(monkeypatch):
    """Debian's /etc/hosts maps the machine's own name to 127.0.1.1: on node 0, the
    endpoint's host would route through loopback, which no other node reaches."""
    assert nodes.choose("127.0.0.1", 29500, None) == (launch.loopback_interface(), "127.0.0.1", True)
    monkeypatch.setattr(nodes, "source_address", lambda host, port: "127.0.1.1")
    with pytest.raises(ValueError, match="node-a resolves to a loopback address on this machine.*--iface"):
        nodes.choose("node-a", 29500, None)


def test_torchrun_sh_takes_the_same_node_options(tmp_path, fake_python):
    cfg = TrialConfig(nprocs=2, threads=1, batch_size=32)
    env, _ = launch.environment(cfg, machine=machine_doc())
    emit.write_outputs(tmp_path / "out", cfg=cfg, model_file=TINY, env=env,
                       document=run_document(cfg, baseline=cfg), description="t")
    script = tmp_path / "out" / "torchrun.sh"
    one = argv_of(run_script(script, fake_python, "--max-restarts", "0", "--", "--epochs", "1"))
    assert flag(one, "--nnodes") == "1" and flag(one, "--rdzv-endpoint") == "127.0.0.1:0"
    proc = run_script(script, fake_python, *node_args(2, 1, "127.0.0.1:29555"), "--iface", "lo",
                      "--max-restarts", "0", "--", "--epochs", "1")
    assert proc.returncode == 0, proc.stderr
    argv = argv_of(proc)
    assert (flag(argv, "--nnodes"), flag(argv, "--rdzv-endpoint"), flag(argv, "--rdzv-conf")) == (
        "2", "127.0.0.1:29555", "is_host=0")
    assert flag(argv, "--max-restarts") == "0" and argv[-2:] == ["--epochs", "1"] and "--" not in argv
    assert "ENV GLOO=lo" in proc.stdout and "NPROCS=unset" in proc.stdout
    bad = run_script(script, fake_python, "--nnodes", "2", "--")
    assert bad.returncode == 2 and "torchrun.sh: --rdzv-endpoint HOST:PORT is needed" in bad.stderr


def test_the_accelerate_and_lightning_files_say_how_to_run_on_several_nodes():
    cfg = TrialConfig(nprocs=2, threads=1, batch_size=64)
    env, _ = launch.environment(cfg, machine=machine_doc())
    accelerate = stack_configs.render_accelerate(cfg, TrialConfig(batch_size=32), env)
    for words in ("num_machines: N, machine_rank: R", "main_process_ip: node 0's address",
                  "Keep the per-process batch 32: the global batch becomes N x 64",
                  "--nnodes N --node-rank R --rdzv-endpoint HOST:PORT"):
        assert words in accelerate, words
    assert "num_machines: 1" in accelerate  # the file itself stays one node's
    lightning = stack_configs.lightning_arguments(cfg, TrialConfig(batch_size=32), env)
    assert lightning["trainer"]["num_nodes"] == 1 and lightning["dataloader"]["batch_size"] == 32
    several = lightning["several_nodes"]
    assert "Trainer(num_nodes=N)" in several["num_nodes"] and "batch_size stays 32" in several["dataloader"]
    assert "--nnodes N --node-rank R --nproc-per-node 2" in several["launch"]


# --- sbatch.sh ---------------------------------------------------------------------------------

FAKE_SCONTROL = '''#!/bin/sh
case "$1 $2" in
  "show hostnames") printf 'node-a\\nnode-b\\n' ;;
  "show job") echo "JobId=$3 JobName=train"; echo "   Command=$FOLDER/sbatch.sh --epochs 1" ;;
  *) exit 1 ;;
esac
'''
# srun runs its command once per node, each with its own SLURM_NODEID.
FAKE_SRUN = '''#!/bin/bash
printf '%s\\n' "$@" > "$RECORD/srun-args"
while [ "${1#--}" != "$1" ]; do shift; done
for node in 0 1; do SLURM_NODEID=$node "$@"; done
'''
# launch.sh's stand-in: the argument vector each node's task hands it.
RECORDING_LAUNCH = '''#!/bin/bash
printf '%s\\n' "$@" > "$RECORD/launch-$SLURM_NODEID"
'''


def test_sbatch_sh_runs_launch_sh_on_every_node_with_its_own_node_rank(tmp_path):
    cfg = TrialConfig(nprocs=2, threads=1, batch_size=32)
    env, _ = launch.environment(cfg, machine=machine_doc())
    out = tmp_path / "out"
    doc = emit.write_outputs(out, cfg=cfg, model_file=TINY, env=env, document=run_document(cfg, baseline=cfg),
                             description="t")
    assert doc.outputs["slurm"] == "sbatch.sh" and os.access(out / "sbatch.sh", os.X_OK)
    text = (out / "sbatch.sh").read_text()
    assert subprocess.run(["bash", "-n", str(out / "sbatch.sh")]).returncode == 0
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert directives == ["#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --cpus-per-task=2",
                          "#SBATCH --exclusive"]
    assert "##SBATCH --time=" in text
    assert [line for line in text.splitlines() if line.startswith("srun ")] == [slurm.SRUN_LINE]

    # As Slurm runs it: a copy in its spool folder, the output folder found from the job's
    # Command=, node 0's name from the node list, one task per node.
    bin_dir, record, spool, folder = (tmp_path / n for n in ("bin", "record", "spool", "folder"))
    for d in (bin_dir, record, spool, folder):
        d.mkdir()
    for name, body in (("scontrol", FAKE_SCONTROL), ("srun", FAKE_SRUN)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    (folder / "launch.sh").write_text(RECORDING_LAUNCH)
    (folder / "launch.sh").chmod(0o755)
    (spool / "slurm_script").write_text(text)
    job = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node-[a-b]", "SLURM_NNODES": "2", "SLURM_NODEID": "0",
           "SLURM_CPUS_ON_NODE": "2", "SLURM_SUBMIT_DIR": str(tmp_path)}
    proc = subprocess.run(["bash", str(spool / "slurm_script"), "--max-steps", "3", "a b"], cwd=tmp_path,
                          env={**os.environ, **job, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                               "RECORD": str(record), "FOLDER": str(folder)},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    srun = (record / "srun-args").read_text().splitlines()
    assert srun[:4] == ["--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=2", "--kill-on-bad-exit=1"]
    for rank in (0, 1):
        argv = (record / f"launch-{rank}").read_text().splitlines()
        # the command the two-node test runs, on a real node list (no --iface: it is routed)
        assert argv == [*node_args(2, rank, "node-a:29500"), "--max-steps", "3", "a b"]


def test_sbatch_sh_names_the_gpus_and_a_layout_left_to_pytorch():
    text = slurm.render_sbatch(TrialConfig(device="cuda", nprocs=8, batch_size=512, backend="nccl"), {})
    assert "#SBATCH --gpus-per-node=8" in text and "#SBATCH --cpus-per-task" not in text
    assert "left the threads to PyTorch: add --cpus-per-task" in text
    pinned = slurm.cores_per_node(TrialConfig(nprocs=2, threads=2, batch_size=32, affinity="compact"),
                                  {"TUNED_CPUS_PER_RANK": "0,1;2,3"})
    assert pinned == 4


# --- the runtime's side ------------------------------------------------------------------------


@pytest.mark.parametrize(("env", "expected"), [
    ({}, 1), ({"WORLD_SIZE": "4"}, 1), ({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"}, 1),
    ({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "2"}, 4), ({"WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4"}, 1),
    ({"WORLD_SIZE": "x", "LOCAL_WORLD_SIZE": "2"}, 1),
])
def test_the_nodes_of_a_job_come_from_torchruns_world_sizes(monkeypatch, env, expected):
    for key in ("WORLD_SIZE", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert nodes.count() == expected


def test_the_learning_rate_note_names_the_global_batch_of_several_nodes():
    one = batch_note(64, baseline_batch=16)
    assert one is not None and one.startswith("note: the tuned batch size 64 is 4x your 16")
    assert batch_note(16, baseline_batch=16) is None and batch_note(16, baseline_batch=None) is None
    two = batch_note(16, baseline_batch=16, nodes=2)
    assert two is not None and "the global batch size 32 (the tuned 16 per node x 2 nodes) is 2x your 16" in two
    unknown = batch_note(16, baseline_batch=None, nodes=4)
    assert unknown is not None and "the global batch size 64 (the tuned 16 per node x 4 nodes)" in unknown


def test_a_lost_peer_is_named_in_one_line_and_in_torchruns_error_file(tmp_path, monkeypatch, capsys):
    from autotune.runtime.distributed import lost_peer, report_lost_peer

    error = RuntimeError("[/w/gloo/transport/tcp/pair.cc:537] Read error [10.0.0.2]:4242: Connection reset "
                         "by peer. This is typically caused by a remote worker hanging")
    assert lost_peer(error) and not lost_peer(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not lost_peer(RuntimeError("DataLoader worker (pid 7) exited: Broken pipe"))
    assert lost_peer(torch.distributed.DistBackendError("NCCL error: remote process exited or there was a "
                                                        "network error"))
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    line = report_lost_peer(3, error)
    assert capsys.readouterr().err == line + "\n"
    assert line.startswith("error: rank 3 lost another rank of the job")
    assert line.endswith("(Read error [10.0.0.2]:4242: Connection reset by peer)")
    assert json.loads((tmp_path / "error.json").read_text())["message"]["message"] == line


def test_a_rank_under_torchrun_dies_with_its_agent(tmp_path):
    """bootstrap() under torchrun (TORCHELASTIC_RUN_ID) sets the parent-death signal: the
    rank of a SIGKILLed agent ends too."""
    code = ("import os, sys, time; sys.path.insert(0, sys.argv[1])\n"
            "from autotune.runtime import ranks\n"
            "ranks.bootstrap()\n"
            "open(sys.argv[2], 'w').write(str(os.getpid()))\n"
            "time.sleep(60)\n")
    agent = ("import subprocess, sys, time\n"
             f"subprocess.Popen([sys.executable, '-c', {code!r}, sys.argv[1], sys.argv[2]], start_new_session=True)\n"
             "time.sleep(60)\n")
    marker = tmp_path / "rank.pid"
    env = {k: v for k, v in os.environ.items() if k not in ("TUNED_NPROCS", "RANK")}
    proc = subprocess.Popen([sys.executable, "-c", agent, str(Path(__file__).resolve().parent.parent), str(marker)],
                            env={**env, "TORCHELASTIC_RUN_ID": "job-1"})
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() or not marker.read_text():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        rank = int(marker.read_text())
        proc.kill()
        proc.wait()
        deadline = time.monotonic() + 10
        while _alive(rank):
            assert time.monotonic() < deadline, "the rank outlived its agent"
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.slow
def test_ranks_torchrun_restarts_go_on_from_the_newest_checkpoint(tmp_path, no_autotune_env):
    """torchrun --max-restarts starts the ranks again with the same arguments after a rank
    or a node failed (TORCHELASTIC_RESTART_COUNT > 0): they go on from the newest checkpoint,
    to the losses of a run that never stopped, not from step 0. (The restart itself is
    torchrun's: here the restarted rank is started as torchrun would start it.)"""
    emit_outputs(tmp_path / "out", TrialConfig(threads=1, batch_size=16), TINY)
    ckpt = ("--checkpoint-every", "2", "--log-every", "1", "--report", "r.json")
    whole = run_launch_sh(tmp_path / "out", tmp_path / "whole", no_autotune_env, "--max-steps", "10",
                          "--checkpoint-dir", str(tmp_path / "whole-ckpt"), *ckpt)
    assert "resumed" not in whole.stdout
    uninterrupted = json.loads((tmp_path / "whole" / "r.json").read_text())["losses"]
    first = ("--checkpoint-dir", str(tmp_path / "ckpt"), *ckpt)
    run_launch_sh(tmp_path / "out", tmp_path / "first", no_autotune_env, "--max-steps", "6", *first)
    again = run_launch_sh(tmp_path / "out", tmp_path / "again",
                          {**no_autotune_env, "TORCHELASTIC_RESTART_COUNT": "1"}, "--max-steps", "10", *first)
    assert "at step 6" in again.stdout, again.stdout[-2000:]
    resumed = json.loads((tmp_path / "again" / "r.json").read_text())["losses"]
    assert resumed == uninterrupted[6:] and len(uninterrupted) == 10
    # the first start of a job (no restart yet) trains from step 0, checkpoints or not
    fresh = run_launch_sh(tmp_path / "out", tmp_path / "fresh", no_autotune_env, "--max-steps", "10", *first)
    assert "resumed" not in fresh.stdout
