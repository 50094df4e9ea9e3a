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
import time
from pathlib import Path

import psutil
import pytest

from autotune.config import TrialConfig
from autotune.emit import hf_trainer, stack_knobs
from autotune.emit import outputs as emit
from autotune.emit import stacks as stack_configs
from autotune.trials import launch

from helpers import MODELS, machine_doc, run_as_group, run_document

TINY = MODELS / "tiny_cnn.py"
BLOCKS = MODELS / "blocks_mlp.py"  # repeated blocks, for the memory knobs
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
        TrialConfig(device="cuda", nprocs=8, batch_size=512, precision="fp16", backend="nccl",
                    cudnn_benchmark=True), BASELINE, {})
    assert gpu["trainer"]["benchmark"] is True
    assert gpu["trainer"]["accelerator"] == "gpu" and gpu["trainer"]["devices"] == 8
    assert gpu["trainer"]["precision"] == "16-mixed" and gpu["dataloader"]["batch_size"] == 64


def test_knobs_a_stack_cannot_hold_are_named_in_each_file():
    cfg = TrialConfig(threads=2, prune_ratio=0.25, affinity="compact", precision="tf32", ipex=True,
                      interop_threads=1)
    env = launch.environment(cfg, machine=machine_doc(), base_env={})[0]
    assert "TUNED_CPUS_PER_RANK" in env
    header = "\n".join(line for line in stack_configs.render_accelerate(cfg, BASELINE, env).splitlines()
                       if line.startswith("# Not expressible"))
    notes = " ".join(stack_configs.lightning_arguments(cfg, BASELINE, env)["not_expressible"])
    for text in (header, notes):
        for word in ("structured pruning (0.25)", "core pinning", "tf32", "ipex", "interop threads"):
            assert word in text, (word, text)
    snippet = stack_configs.render_snippet(cfg, BASELINE, env)
    assert "Structured pruning (0.25" in snippet
    assert 'torch.backends.cuda.matmul.fp32_precision = "tf32"' in snippet
    # taskset pinning is train_tuned.py's own: other launchers do not read the variable
    assert "TUNED_CPUS_PER_RANK" not in stack_configs.lightning_arguments(cfg, BASELINE, env)["environment"]


def test_tf32_is_matmul_only_in_the_new_api_with_the_legacy_flag_in_step():
    cfg, baseline = TrialConfig(device="cuda", precision="tf32"), TrialConfig(device="cuda")
    files = [stack_configs.render_accelerate(cfg, baseline, {}), stack_configs.render_snippet(cfg, baseline, {}),
             " ".join(stack_configs.lightning_arguments(cfg, baseline, {})["not_expressible"])]
    for text in files:
        assert 'torch.backends.cuda.matmul.fp32_precision = "tf32"' in text
        # torch 2.9-2.13: setting only the new API makes torch.compile's reads of the legacy flag raise
        assert "torch.backends.cuda.matmul.allow_tf32 = True" in text
        assert "cudnn" not in text  # cuDNN's TF32 is on by default: left alone


def test_the_snippets_tf32_lines_leave_torch_compiles_reads_working():
    code = [line.split("  #")[0] for line in _python_blocks(stack_configs.render_snippet(
        TrialConfig(device="cuda", precision="tf32"), TrialConfig(device="cuda"), {}))[0].splitlines()
        if "fp32_precision" in line or "allow_tf32" in line]
    check = "\n".join(["import torch", *code, "print(torch.get_float32_matmul_precision(),",
                       "      torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.conv.fp32_precision)"])
    proc = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["high", "True", "tf32"]  # cuDNN's own default, untouched


def test_cudnn_benchmark_is_lightnings_benchmark_and_a_line_elsewhere():
    cfg = TrialConfig(device="cuda", cudnn_benchmark=True)
    baseline = TrialConfig(device="cuda")
    assert stack_configs.lightning_arguments(cfg, baseline, {})["trainer"]["benchmark"] is True
    assert not any("benchmark" in note for note in stack_configs.lightning_arguments(cfg, baseline, {})
                   ["not_expressible"])
    assert "benchmark" not in stack_configs.lightning_arguments(baseline, baseline, {})["trainer"]
    accelerate = stack_configs.render_accelerate(cfg, baseline, {})
    assert any(line.startswith("# Not expressible") and "torch.backends.cudnn.benchmark = True" in line
               for line in accelerate.splitlines())
    (code,) = _python_blocks(stack_configs.render_snippet(cfg, baseline, {}))
    assert "torch.backends.cudnn.benchmark = True" in code
    assert "cudnn.benchmark" not in stack_configs.render_accelerate(baseline, baseline, {})
    assert "Nothing differs" in stack_configs.render_snippet(baseline, baseline, {})


def test_the_snippet_for_eight_gpus_sets_each_ranks_device_sampler_and_copies():
    cfg = TrialConfig(device="cuda", backend="nccl", nprocs=8, batch_size=512, num_workers=4,
                      persistent_workers=True, pin_memory=True, precision="fp16")
    text = stack_configs.render_snippet(cfg, TrialConfig(device="cuda", batch_size=64), {})
    (code,) = _python_blocks(text)
    compile(code, "snippet", "exec")
    lines = [line.split("  #")[0].strip() for line in code.splitlines()]
    for line in ('torch.distributed.init_process_group("nccl")', "torch.cuda.set_device(local_rank)",
                 "model = model.to(local_rank)",
                 "model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])",
                 "sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True)",
                 "sampler.set_epoch(epoch)", "inputs = inputs.to(device, non_blocking=True)",
                 "targets = targets.to(device, non_blocking=True)", "import os"):
        assert line in lines, line
    # set_device before the model or any batch touches a GPU
    assert lines.index("torch.cuda.set_device(local_rank)") < lines.index("model = model.to(local_rank)")
    (loader,) = [line for line in lines if line.startswith("loader = ")]
    assert "sampler=sampler" in loader and "shuffle=False" in loader and "shuffle=True" not in loader
    assert "pin_memory=True" in loader and "batch_size=64" in loader
    assert "scaler.unscale_(optimizer)" in code and "clip_grad_norm_" in code
    # the unscale comes before the clipping in the advice
    assert code.index("scaler.unscale_(optimizer)") < code.index("clip_grad_norm_")


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
    tuned = TUNED.replace(allocator="default")
    doc = emit.write_outputs(tmp_path, cfg=tuned, model_file=TINY, env=env,
                             document=run_document(tuned, baseline=BASELINE), description="t")
    for key, name in (("accelerate", "accelerate_config.yaml"), ("lightning", "lightning_trainer.json"),
                      ("torchrun", "torchrun.sh"), ("snippet", "apply_to_your_loop.md"),
                      ("hf_trainer", "hf_training_args.json")):
        assert doc.outputs[key] == name and (tmp_path / name).is_file()
    hf = json.loads((tmp_path / "hf_training_args.json").read_text())
    assert hf["training_args"]["per_device_train_batch_size"] == 32 and hf["training_args"]["ddp_backend"] == "gloo"
    assert hf["env"]["OMP_NUM_THREADS"] == "1"
    what_you_get = (Path(__file__).parent.parent / "docs" / "outputs.md").read_text()
    for name in doc.outputs.values():  # every file a run writes is documented where users look
        assert f"`{name}`" in what_you_get, name
    assert os.access(tmp_path / "torchrun.sh", os.X_OK)
    candidate = emit.write_candidate(tmp_path / "candidate", cfg=TUNED, model_file=TINY, env=env,
                                     description="t")
    assert "accelerate" not in candidate.outputs  # a verification candidate needs none


def test_threads_left_to_pytorch_are_named_with_the_count_it_chose(tmp_path):
    # accelerate launch would choose all physical cores and torchrun 1 per rank: the
    # files name the count the tuned configuration ran with, and the snippet, which
    # the user's loop runs as the baseline did, stays empty.
    stack_configs.write_stack_files(tmp_path, cfg=BASELINE, baseline=BASELINE, env={}, default_threads=3)
    accelerate = (tmp_path / "accelerate_config.yaml").read_text()
    assert "OMP_NUM_THREADS=3 accelerate launch" in accelerate and "--num_cpu_threads_per_process 3" in accelerate
    assert json.loads((tmp_path / "lightning_trainer.json").read_text())["environment"]["OMP_NUM_THREADS"] == "3"
    hf_trainer.write_hf_arguments(tmp_path, cfg=BASELINE, baseline=BASELINE, env={}, default_threads=3)
    hf = json.loads((tmp_path / "hf_training_args.json").read_text())
    assert hf["env"]["OMP_NUM_THREADS"] == "3" and hf["launch"] == "OMP_NUM_THREADS=3 python your_script.py"
    assert "OMP_NUM_THREADS=3" in hf["not_expressible"][0]
    assert "OMP_NUM_THREADS" in (tmp_path / "torchrun.sh").read_text()
    assert "Nothing differs" in (tmp_path / "apply_to_your_loop.md").read_text()


def test_accelerates_own_loader_reads_the_file(tmp_path):
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(stack_configs.render_accelerate(TUNED, BASELINE, ENV))
    loaded = config_args.ClusterConfig.from_yaml_file(yaml_file=str(path))
    assert loaded.num_processes == 2 and str(loaded.distributed_type) .endswith("MULTI_CPU")
    assert loaded.mixed_precision == "bf16" and loaded.use_cpu is True
    assert loaded.dynamo_config == {"dynamo_backend": "INDUCTOR", "dynamo_mode": "max-autotune"}


# --- under the real tools ------------------------------------------------------------------------

ACCELERATE_SCRIPT = """
import importlib.util, json, os, sys
import torch
from accelerate import Accelerator
from torch.distributed.tensor import DTensor

spec = importlib.util.spec_from_file_location("user", sys.argv[1])
user = importlib.util.module_from_spec(spec); spec.loader.exec_module(user)
batch_size, out = int(sys.argv[2]), sys.argv[3]
memory = open(sys.argv[4]).read() if len(sys.argv) > 4 else ""  # the file's lines, up to the optimizer
accelerator = Accelerator()
model = user.build_model()
blocks = [m for m in model.modules() if type(m).__name__ == "Block"]
forwards = [0]
for block in blocks:
    block.register_forward_pre_hook(lambda *a: forwards.__setitem__(0, forwards[0] + 1))
exec(memory, {**vars(user), "model": model})
optimizer = user.build_optimizer(model.parameters())
loader = torch.utils.data.DataLoader(user.build_dataset(), batch_size=batch_size, shuffle=True, drop_last=True)
if memory:  # sharded: the file says prepare(model) would wrap the shards in DDP
    optimizer, loader = accelerator.prepare(optimizer, loader)
else:
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
steps = [0]
optimizer.optimizer.register_step_post_hook(lambda *a: steps.__setitem__(0, steps[0] + 1))
losses = []
for step, (inputs, targets) in enumerate(loader):
    with accelerator.accumulate(model):
        if memory:
            model.set_requires_gradient_sync(accelerator.sync_gradients)
        with accelerator.autocast():
            loss = torch.nn.functional.cross_entropy(model(inputs), targets)
        accelerator.backward(loss)
        optimizer.step(); optimizer.zero_grad()
    losses.append(loss.item())
    if step == 3:
        break
with open(os.path.join(out, f"rank{accelerator.process_index}.json"), "w") as f:
    json.dump({"mixed_precision": accelerator.mixed_precision, "processes": accelerator.num_processes,
               "threads": torch.get_num_threads(), "distributed": str(accelerator.distributed_type),
               "compiled": type(model).__name__, "losses": losses,
               "accumulation": accelerator.gradient_accumulation_steps, "optimizer_steps": steps[0],
               "block_forwards_per_batch": forwards[0] / len(losses) / max(len(blocks), 1),
               "sharded": all(isinstance(p, DTensor) for p in model.parameters())}, f)
accelerator.wait_for_everyone()
accelerator.end_training()  # the process group ends before the interpreter (gloo aborts otherwise)
# Even so, gloo's threads can abort a rank at interpreter teardown ("terminate called
# without an active exception"): everything is written, leave without the teardown, as
# train_tuned.py does.
sys.stdout.flush()
os._exit(0)
"""

# All three memory knobs at once, on 2 CPU ranks over gloo: Accelerate shards only on GPUs,
# so the file gives the lines that shard (and checkpoint) the model before prepare().
MEMORY_KNOBS = TrialConfig(nprocs=2, threads=1, batch_size=32, precision="bf16", grad_accum=2, sharding="full",
                           activation_checkpointing=True)


def _accelerate_memory_lines(text: str) -> str:
    """The lines the file gives for sharding on CPU, up to the user's optimizer; none where
    it gives none (the script then prepares the model, as Accelerate's FSDP would)."""
    lines = text.splitlines()
    first = next((i + 1 for i, line in enumerate(lines) if line.startswith("#   shard the model yourself")), None)
    if first is None:
        return ""
    code = []
    for line in lines[first:]:
        if not line.startswith("#     ") or line.startswith("#     optimizer = "):
            break
        code.append(line[len("#     "):])
    assert "#     optimizer, loader = accelerator.prepare(optimizer, loader)" in text
    return "\n".join(code)


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [TrialConfig(threads=1, batch_size=16, precision="bf16"),
                                 TrialConfig(nprocs=2, threads=1, batch_size=32, precision="bf16"),
                                 TrialConfig(batch_size=16, precision="bf16"),
                                 MEMORY_KNOBS],
                         ids=["one-process", "two-processes", "pytorchs-threads", "memory-knobs"])
def test_the_accelerate_config_runs_under_accelerate_launch(tmp_path, cfg):
    pytest.importorskip("accelerate")
    memory = cfg.grad_accum > 1
    env, _ = launch.environment(cfg, machine=machine_doc(), base_env={})
    # Where the tuned configuration left the threads to PyTorch, PyTorch chose 1 on the
    # tuning machine (say): accelerate launch must not choose its own (2 cores here).
    stack_configs.write_stack_files(tmp_path, cfg=cfg, baseline=BASELINE, env=env, default_threads=1,
                                    blocks=("Block",) if memory else ())
    text = (tmp_path / "accelerate_config.yaml").read_text()
    (tmp_path / "train.py").write_text(ACCELERATE_SCRIPT)
    model = BLOCKS if memory else TINY
    args = f"train.py {model} {stack_knobs.loader_kwargs(cfg)['batch_size']} {tmp_path}"
    if _accelerate_memory_lines(text):
        (tmp_path / "memory.py").write_text(_accelerate_memory_lines(text))
        args += f" {tmp_path / 'memory.py'}"
    run = next(line for line in text.splitlines()
               if line.startswith("# Run: "))[len("# Run: "):].replace("your_script.py", args)
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
        assert len(rank["losses"]) == 4
        # each knob took effect inside the rank: 4 loader batches, one step per 2; every
        # parameter a shard; each block's forward again in the backward pass
        assert rank["accumulation"] == cfg.grad_accum and rank["optimizer_steps"] == 4 // cfg.grad_accum
        assert rank["sharded"] is memory
        assert rank["block_forwards_per_batch"] == (2 if memory else 0)


LIGHTNING_SCRIPT = """
import importlib, importlib.util, json, os, sys
import torch
import lightning
from torch.distributed.tensor import DTensor

spec = importlib.util.spec_from_file_location("user", sys.argv[1])
user = importlib.util.module_from_spec(spec); spec.loader.exec_module(user)
doc = json.load(open(sys.argv[2]))
out = sys.argv[3]


class Module(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = user.build_model()
        self.blocks = [m for m in self.model.modules() if type(m).__name__ == "Block"]
        self.seen = {"batches": 0, "optimizer_steps": 0, "block_forwards": 0}
        for block in self.blocks:
            block.register_forward_pre_hook(lambda *a: self.seen.__setitem__(
                "block_forwards", self.seen["block_forwards"] + 1))

    def configure_model(self):  # where the file's lines go
        exec("\\n".join((doc["strategy"] or {}).get("configure_model", [])), {**vars(user), "self": self})

    def training_step(self, batch, i):
        inputs, targets = batch
        self.seen["batches"] += 1
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

    def on_before_optimizer_step(self, optimizer):
        self.seen["optimizer_steps"] += 1

    def on_train_end(self):
        with open(os.path.join(out, f"end{self.global_rank}.json"), "w") as f:
            json.dump({**self.seen, "blocks": len(self.blocks),
                       "sharded": all(isinstance(p, DTensor) for p in self.parameters())}, f)

    def configure_optimizers(self):
        return user.build_optimizer(self.parameters())


args = dict(doc["trainer"])
if doc["strategy"]:  # the object the file describes: its class, built with its keyword arguments
    module, name = doc["strategy"]["class"].rsplit(".", 1)
    kwargs = {k: v for k, v in doc["strategy"].items() if k not in ("class", "note", "configure_model")}
    args["strategy"] = getattr(importlib.import_module(module), name)(**kwargs)
trainer = lightning.Trainer(**args, max_steps=2, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False)
loader = torch.utils.data.DataLoader(user.build_dataset(), shuffle=True, **doc["dataloader"])
trainer.fit(Module(), loader)
"""


@pytest.mark.slow
@pytest.mark.parametrize("cfg", [TrialConfig(threads=2, batch_size=32, precision="bf16"),
                                 TrialConfig(nprocs=2, threads=1, batch_size=32, num_workers=1,
                                             persistent_workers=True, precision="bf16"),
                                 MEMORY_KNOBS],
                         ids=["one-device", "two-devices-ddp", "memory-knobs"])
def test_the_lightning_arguments_train_under_a_real_trainer(tmp_path, cfg):
    pytest.importorskip("lightning")
    memory = cfg.grad_accum > 1
    env, _ = launch.environment(cfg, machine=machine_doc())
    doc = stack_configs.lightning_arguments(cfg, BASELINE, env, blocks=("Block",) if memory else ())
    (tmp_path / "args.json").write_text(json.dumps(doc))
    (tmp_path / "fit.py").write_text(LIGHTNING_SCRIPT)
    # Lightning starts the second rank itself: run_as_group leaves none of its ranks behind
    proc = run_as_group([sys.executable, "fit.py", str(BLOCKS if memory else TINY), "args.json", str(tmp_path)],
                        cwd=tmp_path, timeout=240,
                        env={**{k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"},
                             **doc["environment"]})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for rank in range(cfg.nprocs):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert seen["precision"] == "bf16-mixed" and seen["autocast_bf16"]
        assert seen["devices"] == cfg.nprocs and seen["world"] == cfg.nprocs
        assert seen["threads"] == cfg.threads
        assert seen["batch"] == cfg.batch_size // cfg.nprocs // cfg.grad_accum
        if cfg.nprocs > 1:
            assert seen["backend"] == "gloo"
            # FSDPStrategy refuses a CPU: FSDP2 there is ModelParallelStrategy's
            assert seen["strategy"] == ("ModelParallelStrategy" if memory else "DDPStrategy")
        end = json.loads((tmp_path / f"end{rank}.json").read_text())
        # each knob took effect inside the rank: one optimizer step per grad_accum batches,
        # every parameter a shard, each block's forward again in the backward pass
        assert end["optimizer_steps"] == 2 and end["batches"] == 2 * cfg.grad_accum
        assert end["sharded"] is memory
        assert end["block_forwards"] == (2 * end["batches"] * end["blocks"] if memory else 0)
        assert end["blocks"] == (4 if memory else 0)


@pytest.mark.slow
def test_torchrun_sh_starts_the_ranks_and_passes_torchrun_flags_before_the_double_dash(tmp_path):
    cfg = TrialConfig(nprocs=2, threads=1, batch_size=32)
    env, _ = launch.environment(cfg, machine=machine_doc())
    emit.write_outputs(tmp_path / "out", cfg=cfg, model_file=TINY, env=env,
                       document=run_document(cfg, baseline=BASELINE), description="t")
    text = (tmp_path / "out" / "torchrun.sh").read_text()
    assert '--rdzv-endpoint "${endpoint:-127.0.0.1:0}"' in text and "TUNED_NPROCS" not in text
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


STAND_IN = '''
import json, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
out = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(out, f"rank{os.environ['RANK']}.json"), "w") as f:
    json.dump({"rank": os.environ["RANK"], "world": os.environ["WORLD_SIZE"],
               "omp": os.environ.get("OMP_NUM_THREADS"), "threads": torch.get_num_threads(),
               "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"), "argv": sys.argv[1:], "pid": os.getpid()}, f)
deadline = time.time() + 60
while not os.path.exists(os.path.join(out, "release")) and time.time() < deadline:
    time.sleep(0.1)
dist.barrier()
dist.destroy_process_group()
'''

LOOPBACK = ("127.0.0.1", "::1")


def _listeners(root: psutil.Process) -> dict[int, set[str]]:
    pids = {root.pid} | {c.pid for c in root.children(recursive=True)}
    found: dict[int, set[str]] = {}
    for conn in psutil.net_connections(kind="inet"):
        if conn.pid in pids and conn.status == psutil.CONN_LISTEN:
            found.setdefault(conn.pid, set()).add(conn.laddr.ip)
    return found


@pytest.mark.slow
def test_torchrun_sh_ranks_listen_on_loopback_and_a_users_variable_is_kept(tmp_path):
    user_omp = "2"  # the tuned 1 is train_tuned.py's test above
    cfg = TrialConfig(nprocs=2, threads=1, batch_size=32)
    text = stack_configs.render_torchrun(cfg, launch.environment(cfg, machine=machine_doc(), base_env={})[0])
    assert '--rdzv-endpoint "${endpoint:-127.0.0.1:0}"' in text and "--standalone" not in text
    script = tmp_path / stack_configs.TORCHRUN_NAME
    script.write_text(text)
    script.chmod(0o755)
    (tmp_path / "train_tuned.py").write_text(STAND_IN)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if user_omp:
        env["OMP_NUM_THREADS"] = user_omp
    proc = subprocess.Popen([str(script), "--max-restarts", "0", "--", "--epochs", "1"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not all((tmp_path / f"rank{r}.json").exists() for r in range(2)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        time.sleep(0.5)  # both ranks are past init_process_group: every socket is open
        try:
            listening = _listeners(psutil.Process(proc.pid))
        except psutil.AccessDenied:
            listening = None
    finally:
        (tmp_path / "release").touch()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out[-2000:] + err[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert sorted(r["rank"] for r in ranks) == ["0", "1"] and {r["world"] for r in ranks} == {"2"}
    want = user_omp or "1"
    assert {r["omp"] for r in ranks} == {want} and {r["threads"] for r in ranks} == {int(want)}
    assert {tuple(r["argv"]) for r in ranks} == {("--epochs", "1")}  # torchrun's flags stayed before --
    # where the hostname resolves beyond loopback, gloo would listen there without it
    assert {r["gloo_ifname"] for r in ranks} == {launch.loopback_interface()}
    if user_omp:
        assert f"keeping your OMP_NUM_THREADS={user_omp}" in err
    if listening is not None:
        rank_pids = {r["pid"] for r in ranks}
        for pid in rank_pids:  # gloo, bound by GLOO_SOCKET_IFNAME
            assert listening.get(pid) and listening[pid] <= set(LOOPBACK), listening
        beyond = {pid: ips - set(LOOPBACK) for pid, ips in listening.items() if ips - set(LOOPBACK)}
        # Only torchrun's own store may (torch binds it to every interface, whatever the
        # rendezvous address), and then the script says so in its header.
        assert set(beyond) <= {proc.pid}, listening
        if beyond:
            assert "torchrun's store listens on every interface" in text
