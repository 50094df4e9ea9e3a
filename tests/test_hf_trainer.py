"""hf_training_args.json: the tuned configuration as Hugging Face TrainingArguments. The
arguments build a real ``transformers.TrainingArguments`` (unknown keys, a prefetch factor
without workers, bf16 without a GPU are all refused there), and hold the tuned knobs."""
from __future__ import annotations

import json
import socket

import pytest
import torch

from autotune.config import TrialConfig
from autotune.emit import hf_trainer

CPU_BASELINE = TrialConfig(batch_size=32)
CPU_TUNED = TrialConfig(nprocs=2, threads=1, batch_size=64, grad_accum=2, num_workers=2, prefetch_factor=4,
                     persistent_workers=True, compile="default", channels_last=True, affinity="compact",
                     allocator="tcmalloc", lr_scaling="linear", lr_batch=32, activation_checkpointing=True)
CPU_ENV = {"OMP_NUM_THREADS": "1", "TUNED_NPROCS": "2", "LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"}
CUDA_BASELINE = TrialConfig(device="cuda", batch_size=32)
CUDA_TUNED = TrialConfig(device="cuda", nprocs=2, backend="nccl", batch_size=256, precision="bf16",
                      compile="max-autotune", optimizer_step="fused", num_workers=4, pin_memory=True,
                      cudnn_benchmark=True)
CUDA_SHARDED = TrialConfig(device="cuda", nprocs=4, backend="nccl", batch_size=64, sharding="grad-op",
                        activation_checkpointing=True, precision="tf32")


def _doc(cfg, baseline, env, blocks=()):
    """The file as a run writes it, read back."""
    return json.loads(json.dumps(hf_trainer.hf_document(cfg, baseline, env, blocks=blocks)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def one_rank(monkeypatch):
    """The environment torchrun gives a rank, for a world of one: TrainingArguments sets up
    the process group of its ddp_backend while it is built, so the tuned arguments are built
    where they run, inside a launched rank."""
    pytest.importorskip("transformers")
    from accelerate.state import AcceleratorState

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(key, value)
    threads = torch.get_num_threads()
    yield monkeypatch
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    AcceleratorState._reset_state(reset_partial_state=True)
    torch.set_num_threads(threads)


def test_the_cpu_arguments_build_trainingarguments_in_a_gloo_rank(one_rank, tmp_path):
    from transformers import TrainingArguments

    doc = _doc(CPU_TUNED, CPU_BASELINE, CPU_ENV)
    for key, value in doc["env"].items():  # as the launch command sets them
        one_rank.setenv(key, value)
    args = TrainingArguments(output_dir=str(tmp_path), **doc["training_args"])
    assert args.per_device_train_batch_size == 16  # 64 over 2 ranks over 2 micro-batches
    assert args.gradient_accumulation_steps == 2
    assert args.use_cpu and args.device.type == "cpu" and args.ddp_backend == "gloo"
    assert torch.distributed.get_backend() == "gloo"  # the Trainer's process group is the tuned one
    assert args.ddp_find_unused_parameters is False
    assert args.torch_compile and args.torch_compile_mode is None  # mode "default": no mode given
    assert (args.dataloader_num_workers, args.dataloader_prefetch_factor) == (2, 4)
    assert args.dataloader_persistent_workers and not args.dataloader_pin_memory
    assert not args.bf16 and not args.fp16 and "optim" not in doc["training_args"]  # the Trainer's own
    assert args.gradient_checkpointing  # the Trainer checkpoints a transformers model's layers
    assert doc["launch"].endswith("torchrun --nnodes 1 --nproc-per-node 2 --rdzv-backend c10d "
                                  "--rdzv-endpoint 127.0.0.1:0 your_script.py")
    assert "OMP_NUM_THREADS=1" in doc["launch"] and "TUNED_NPROCS" not in doc["launch"]
    assert doc["env"] == {"OMP_NUM_THREADS": "1", "LD_PRELOAD": "/usr/lib/libtcmalloc_minimal.so.4"}
    said = " ".join(doc["not_expressible"])
    for knob in ("OMP_NUM_THREADS=1", "LD_PRELOAD", "Core pinning", "channels_last", "learning-rate rule",
                 "multiply every parameter group's lr by 2"):
        assert knob in said, knob


def test_the_cuda_arguments_hold_bf16_compile_and_the_fused_step(monkeypatch, tmp_path):
    """Built here without a GPU: TrainingArguments refuses bf16 and tf32=True unless the GPU
    supports them, and sets up the NCCL process group for ddp_backend="nccl" while it is
    built; those are the GPU machine's to check (test_the_cuda_arguments_build_in_an_nccl_rank),
    so here the device checks answer as on an Ampere GPU (TF32's switch, which would change
    this process's matmul flags, does nothing) and every other check of the arguments runs."""
    pytest.importorskip("transformers")
    import transformers.training_args as training_args
    from transformers import TrainingArguments

    monkeypatch.setattr(training_args, "is_torch_bf16_gpu_available", lambda: True)
    monkeypatch.setattr(training_args, "is_torch_tf32_available", lambda: True)
    monkeypatch.setattr(training_args, "enable_tf32", lambda enable: None)
    monkeypatch.setattr(TrainingArguments, "device", property(lambda self: torch.device("cuda", 0)))
    doc = _doc(CUDA_TUNED, CUDA_BASELINE, {})
    args = TrainingArguments(output_dir=str(tmp_path), **doc["training_args"])
    assert args.bf16 and not args.fp16 and not args.use_cpu
    assert args.optim == "adamw_torch_fused" and args.torch_compile and args.torch_compile_mode == "max-autotune"
    assert args.tf32 is False  # else torch_compile turns TF32 on, which the tuned run did not
    assert args.per_device_train_batch_size == 128 and args.ddp_backend == "nccl"
    assert args.dataloader_pin_memory and args.dataloader_num_workers == 4
    assert args.dataloader_prefetch_factor is None  # none tuned: the DataLoader's own
    said = " ".join(doc["not_expressible"])
    assert "torch.backends.cudnn.benchmark = True" in said and "cudnn.conv.fp32_precision" in said
    assert doc["launch"] == ("torchrun --nnodes 1 --nproc-per-node 2 --rdzv-backend c10d "
                             "--rdzv-endpoint 127.0.0.1:0 your_script.py")

    sharded = _doc(CUDA_SHARDED, CUDA_BASELINE, {}, blocks=("Block",))
    args = TrainingArguments(output_dir=str(tmp_path), **sharded["training_args"])
    assert args.fsdp and args.fsdp_config["reshard_after_forward"] is False  # grad-op keeps them gathered
    assert args.fsdp_config["transformer_layer_cls_to_wrap"] == ["Block"]
    assert args.fsdp_config["activation_checkpointing"] is True
    assert not args.gradient_checkpointing  # FSDP's own, not the Trainer's (a second all-gather)
    assert args.tf32 is True and "optim" not in sharded["training_args"]  # no step tuned: the Trainer's own
    assert "ddp_find_unused_parameters" not in sharded["training_args"]
    assert "fsdp" in sharded["key_names"]


def test_what_the_trainer_cannot_hold_is_named_not_dropped():
    # on CPU Accelerate (the Trainer's) has no FSDP: the sharding goes to not_expressible
    cpu_sharded = TrialConfig(nprocs=2, batch_size=8, sharding="full", activation_checkpointing=True,
                              prune_ratio=0.25)
    doc = _doc(cpu_sharded, TrialConfig(batch_size=8), {})
    assert "fsdp" not in doc["training_args"] and doc["training_args"]["ddp_find_unused_parameters"] is False
    assert doc["training_args"]["gradient_checkpointing"] is True  # the name 5.17 (the GPU machine's) knows
    assert doc["key_names"] == {"gradient_checkpointing": hf_trainer.KEY_NAMES["gradient_checkpointing"]}
    said = doc["not_expressible"]
    assert any(s.startswith("Sharding (full)") for s in said)
    assert any("Structured pruning (0.25" in s for s in said)
    # the optimizer step: a sharded configuration keeps the user's (TrialConfig resets it)
    assert not any("optimizer step" in s for s in said)
    foreach = _doc(TrialConfig(batch_size=8, optimizer_step="foreach"), TrialConfig(batch_size=8), {})
    assert any("foreach=True" in s for s in foreach["not_expressible"]) and "optim" not in foreach["training_args"]
    fused = _doc(TrialConfig(batch_size=8, optimizer_step="fused"), TrialConfig(batch_size=8), {})
    assert fused["training_args"]["optim"] == "adamw_torch_fused"
    assert any("for another torch.optim class build it with fused=True" in s for s in fused["not_expressible"])
    one = _doc(TrialConfig(batch_size=8), TrialConfig(batch_size=8), {})
    assert one["launch"] == "python your_script.py" and one["not_expressible"] == []
    assert "ddp_backend" not in one["training_args"] and "dataloader_prefetch_factor" not in one["training_args"]


@pytest.mark.gpu
def test_the_cuda_arguments_build_in_an_nccl_rank(one_rank, tmp_path):
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: TrainingArguments sets up the NCCL process group and checks bf16 on the GPU")
    from transformers import TrainingArguments

    doc = _doc(CUDA_TUNED, CUDA_BASELINE, {})
    args = TrainingArguments(output_dir=str(tmp_path), **doc["training_args"])
    assert args.device.type == "cuda" and args.bf16 and args.optim == "adamw_torch_fused"
    assert torch.distributed.get_backend() == "nccl"
