"""The tuned configuration for the user's own stack: the Accelerate config file runs under
the real `accelerate launch`, the Lightning arguments build a real Trainer that trains,
torchrun.sh starts train_tuned.py's ranks, and the loop snippet holds exactly the lines
that differ from the baseline."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autotune import emit, launch, stack_configs
from autotune.config import TrialConfig

from helpers import MODELS, machine_doc

TINY = MODELS / "tiny_cnn.py"
BASELINE = TrialConfig(batch_size=32)
TUNED = TrialConfig(nprocs=2, threads=1, batch_size=64, num_workers=1, persistent_workers=True,
                    channels_last=True, precision="bf16", compile="max-autotune-no-cudagraphs",
                    interop_threads=1, allocator="tcmalloc")
ENV = {"OMP_NUM_THREADS": "1", "TUNED_NPROCS": "2", "GLOO_SOCKET_IFNAME": "lo",
       "LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"}


def _python_blocks(markdown: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", markdown, flags=re.S)


# --- the files themselves ------------------------------------------------------------------------


def test_the_accelerate_config_holds_processes_precision_and_compile():
    text = stack_configs.render_accelerate(TUNED, BASELINE, ENV)
    fields = dict(line.split(": ", 1) for line in text.splitlines()
                  if not line.startswith("#") and not line.startswith(" ") and ": " in line)
    assert fields["distributed_type"] == '"MULTI_CPU"' and fields["num_processes"] == "2"
    assert fields["mixed_precision"] == '"bf16"' and fields["use_cpu"] == "true"
    assert fields["main_process_ip"] == '"127.0.0.1"'
    assert '  dynamo_mode: "max-autotune"' in text  # no CUDA graphs on a CPU: the same compilation
    run = next(line for line in text.splitlines() if line.startswith("# Run: "))
    assert "OMP_NUM_THREADS=1" in run and "LD_PRELOAD=/usr/lib/libtcmalloc_minimal.so.4" in run
    assert "ACCELERATE_MIXED_PRECISION=bf16" in run and "--nproc-per-node 2" in run  # torchrun: no mpirun
    assert "--rdzv-endpoint 127.0.0.1:0" in run and "TUNED_NPROCS" not in run
    assert "channels_last" in text and "batch_size=32, num_workers=1" in text  # named, not dropped

    one = stack_configs.render_accelerate(BASELINE.replace(threads=2, precision="bf16"), BASELINE,
                                          {"OMP_NUM_THREADS": "2"})
    assert 'distributed_type: "NO"' in one and 'mixed_precision: "bf16"' in one and "dynamo" not in one
    assert ("# Run: OMP_NUM_THREADS=2 accelerate launch --config_file accelerate_config.yaml "
            "--num_cpu_threads_per_process 2 your_script.py") in one


def test_the_lightning_arguments_hold_devices_strategy_precision_and_the_loader():
    doc = stack_configs.lightning_arguments(TUNED, BASELINE, ENV)
    assert doc["trainer"] == {"accelerator": "cpu", "devices": 2, "num_nodes": 1, "precision": "bf16-mixed",
                              "strategy": "ddp"}
    assert doc["strategy"]["process_group_backend"] == "gloo"
    assert doc["dataloader"] == {"batch_size": 32, "num_workers": 1, "pin_memory": False, "drop_last": True,
                                 "persistent_workers": True}
    assert doc["environment"] == {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
                                  "LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"}
    assert doc["compile"]["mode"] == "max-autotune"
    gpu = stack_configs.lightning_arguments(
        TrialConfig(device="cuda", nprocs=8, batch_size=512, precision="fp16", backend="nccl"), BASELINE, {})
    assert gpu["trainer"]["accelerator"] == "gpu" and gpu["trainer"]["devices"] == 8
    assert gpu["trainer"]["precision"] == "16-mixed" and gpu["dataloader"]["batch_size"] == 64


def test_the_snippet_has_exactly_the_lines_that_differ_and_is_valid_python():
    text = stack_configs.render_snippet(TUNED, BASELINE, ENV)
    (code,) = _python_blocks(text)
    compile(code, "snippet", "exec")
    for line in ("torch.set_num_threads(1)", "torch.set_num_interop_threads(1)", "num_workers=1",
                 "persistent_workers=True", "memory_format=torch.channels_last",
                 'torch.compile(model, mode="max-autotune-no-cudagraphs")',
                 'torch.autocast("cpu", dtype=torch.bfloat16)', "DistributedDataParallel"):
        assert line in code, line
    assert "export LD_PRELOAD=/usr/lib/libtcmalloc_minimal.so.4" in text
    only_batch = stack_configs.render_snippet(BASELINE.replace(batch_size=128), BASELINE, {})
    (code,) = _python_blocks(only_batch)
    assert "batch_size=128" in code
    assert not any(word in code for word in ("autocast", "compile", "channels_last", "set_num_threads"))
    assert "Nothing differs" in stack_configs.render_snippet(BASELINE, BASELINE, {})
    fp16 = stack_configs.render_snippet(TrialConfig(device="cuda", precision="fp16"), TrialConfig(device="cuda"), {})
    assert "GradScaler" in fp16 and 'torch.autocast("cuda", dtype=torch.float16)' in fp16


def test_a_run_writes_them_beside_best_config_and_names_them_in_outputs(tmp_path):
    env, _ = launch.environment(TUNED.replace(allocator="default"), machine=machine_doc())
    doc = emit.write_outputs(tmp_path, cfg=TUNED.replace(allocator="default"), model_file=TINY, env=env,
                             document={"baseline": {"config": BASELINE.to_dict()}}, description="t")
    for key, name in (("accelerate", "accelerate_config.yaml"), ("lightning", "lightning_trainer.json"),
                      ("torchrun", "torchrun.sh"), ("snippet", "apply_to_your_loop.md")):
        assert doc["outputs"][key] == name and (tmp_path / name).is_file()
    assert os.access(tmp_path / "torchrun.sh", os.X_OK)
    candidate = emit.write_outputs(tmp_path / "candidate", cfg=TUNED, model_file=TINY, env=env,
                                   document={"candidate": TUNED.to_dict()}, description="t")
    assert "accelerate" not in candidate["outputs"]  # a verification candidate needs none


def test_accelerates_own_loader_reads_the_file(tmp_path):
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(stack_configs.render_accelerate(TUNED, BASELINE, ENV))
    loaded = config_args.ClusterConfig.from_yaml_file(yaml_file=str(path))
    assert loaded.num_processes == 2 and str(loaded.distributed_type) .endswith("MULTI_CPU")
    assert loaded.mixed_precision == "bf16" and loaded.use_cpu is True
    assert loaded.dynamo_config == {"dynamo_backend": "INDUCTOR", "dynamo_mode": "max-autotune"}


# --- under the real tools ------------------------------------------------------------------------

ACCELERATE_SCRIPT = '''
import importlib.util, json, os, sys
import torch
from accelerate import Accelerator

spec = importlib.util.spec_from_file_location("user", sys.argv[1])
user = importlib.util.module_from_spec(spec); spec.loader.exec_module(user)
accelerator = Accelerator()
model = user.build_model()
optimizer = user.build_optimizer(model.parameters())
loader = torch.utils.data.DataLoader(user.build_dataset(), batch_size=16, shuffle=True, drop_last=True)
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
losses = []
for step, (inputs, targets) in enumerate(loader):
    with accelerator.autocast():
        loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    accelerator.backward(loss)
    optimizer.step(); optimizer.zero_grad()
    losses.append(loss.item())
    if step == 4:
        break
with open(os.path.join(sys.argv[2], f"rank{accelerator.process_index}.json"), "w") as f:
    json.dump({"mixed_precision": accelerator.mixed_precision, "processes": accelerator.num_processes,
               "threads": torch.get_num_threads(), "distributed": str(accelerator.distributed_type),
               "compiled": type(model).__name__, "losses": losses}, f)
accelerator.wait_for_everyone()
accelerator.end_training()  # the process group ends before the interpreter (gloo aborts otherwise)
'''


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [TrialConfig(threads=1, batch_size=16, precision="bf16"),
                                 TrialConfig(nprocs=2, threads=1, batch_size=32, precision="bf16")],
                         ids=["one-process", "two-processes"])
def test_the_accelerate_config_runs_under_accelerate_launch(tmp_path, cfg):
    pytest.importorskip("accelerate")
    env, _ = launch.environment(cfg, machine=machine_doc())
    (tmp_path / "accelerate_config.yaml").write_text(stack_configs.render_accelerate(cfg, BASELINE, env))
    (tmp_path / "train.py").write_text(ACCELERATE_SCRIPT)
    run = next(line for line in (tmp_path / "accelerate_config.yaml").read_text().splitlines()
               if line.startswith("# Run: "))[len("# Run: "):].replace("your_script.py", f"train.py {TINY} {tmp_path}")
    accelerate = Path(sys.executable).parent / "accelerate"
    run = run.replace("accelerate launch", f"{accelerate} launch").replace("python -m", f"{sys.executable} -m")
    proc = subprocess.run(["bash", "-c", run], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240,
                          env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(cfg.nprocs)]
    for rank in ranks:
        assert rank["mixed_precision"] == "bf16" and rank["processes"] == cfg.nprocs
        assert rank["threads"] == 1
        assert rank["distributed"].endswith("MULTI_CPU" if cfg.nprocs > 1 else "NO")
        assert len(rank["losses"]) == 5


LIGHTNING_SCRIPT = '''
import importlib.util, json, os, sys
import torch
import lightning

spec = importlib.util.spec_from_file_location("user", sys.argv[1])
user = importlib.util.module_from_spec(spec); spec.loader.exec_module(user)
doc = json.load(open(sys.argv[2]))
out = sys.argv[3]


class Module(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = user.build_model()

    def training_step(self, batch, i):
        inputs, targets = batch
        loss = torch.nn.functional.cross_entropy(self.model(inputs), targets)
        if i == 0:
            with open(os.path.join(out, f"rank{self.global_rank}.json"), "w") as f:
                json.dump({"precision": self.trainer.precision, "devices": self.trainer.num_devices,
                           "world": self.trainer.world_size, "threads": torch.get_num_threads(),
                           "autocast_bf16": torch.is_autocast_enabled("cpu")
                                            and torch.get_autocast_dtype("cpu") == torch.bfloat16,
                           "strategy": type(self.trainer.strategy).__name__,
                           "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
                           "batch": len(targets)}, f)
        return loss

    def configure_optimizers(self):
        return user.build_optimizer(self.parameters())


args = dict(doc["trainer"])
if doc["strategy"]:
    from lightning.pytorch.strategies import DDPStrategy
    args["strategy"] = DDPStrategy(process_group_backend=doc["strategy"]["process_group_backend"])
trainer = lightning.Trainer(**args, max_steps=3, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
loader = torch.utils.data.DataLoader(user.build_dataset(), shuffle=True, **doc["dataloader"])
trainer.fit(Module(), loader)
'''


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [TrialConfig(threads=2, batch_size=32, precision="bf16"),
                                 TrialConfig(nprocs=2, threads=1, batch_size=32, num_workers=1,
                                             persistent_workers=True, precision="bf16")],
                         ids=["one-device", "two-devices-ddp"])
def test_the_lightning_arguments_train_under_a_real_trainer(tmp_path, cfg):
    pytest.importorskip("lightning")
    env, _ = launch.environment(cfg, machine=machine_doc())
    doc = stack_configs.lightning_arguments(cfg, BASELINE, env)
    (tmp_path / "args.json").write_text(json.dumps(doc))
    (tmp_path / "fit.py").write_text(LIGHTNING_SCRIPT)
    proc = subprocess.run([sys.executable, "fit.py", str(TINY), "args.json", str(tmp_path)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240,
                          env={**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"},
                               **doc["environment"]})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for rank in range(cfg.nprocs):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["precision"] == "bf16-mixed" and seen["autocast_bf16"]
        assert seen["devices"] == cfg.nprocs and seen["world"] == cfg.nprocs
        assert seen["threads"] == cfg.threads
        assert seen["batch"] == cfg.batch_size // cfg.nprocs
        if cfg.nprocs > 1:
            assert seen["strategy"] == "DDPStrategy" and seen["backend"] == "gloo"


@pytest.mark.slow
def test_torchrun_sh_starts_the_ranks_and_passes_torchrun_flags_before_the_double_dash(tmp_path):
    cfg = TrialConfig(nprocs=2, threads=1, batch_size=32)
    env, _ = launch.environment(cfg, machine=machine_doc())
    emit.write_outputs(tmp_path / "out", cfg=cfg, model_file=TINY, env=env,
                       document={"baseline": {"config": BASELINE.to_dict()}}, description="t")
    text = (tmp_path / "out" / "torchrun.sh").read_text()
    assert "--rdzv-endpoint 127.0.0.1:0" in text and "TUNED_NPROCS" not in text
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.run(["bash", str(tmp_path / "out" / "torchrun.sh"), "--max-restarts", "0", "--",
                           "--max-steps", "3", "--no-checkpoint", "--report", "r.json"], cwd=work,
                          capture_output=True, text=True, timeout=240,
                          env={k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    facts = json.loads((work / "r.json").read_text())["facts"]
    assert facts["world"] == 2 and facts["ddp"] is True and facts["threads"] == 1
    assert facts["env"]["OMP_NUM_THREADS"] == "1"
