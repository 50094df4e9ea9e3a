"""apply_to_your_loop.md: the lines of a hand-written training loop that differ from the
user's configuration, and the shell lines to run before Python."""
from __future__ import annotations

import shlex
from collections.abc import Mapping

from autotune.config import TrialConfig
from autotune.emit import gpu_stacks, optimizer
from autotune.emit.stack_knobs import (
    CUDNN_BENCHMARK_LINE,
    TF32_LINES,
    checkpoint_code,
    loader_kwargs,
    loader_kwargs_text,
    shard_code,
    sharded,
)
from autotune.runtime.knobs import CompileMode, Device, Precision

SNIPPET_NAME = "apply_to_your_loop.md"


def _memory_lines(cfg: TrialConfig, blocks: tuple[str, ...]) -> list[str]:
    """Checkpointing and sharding, in PyTorch's order: checkpoint the blocks, shard each
    block, then the whole model, and build the optimizer after (it takes the shards)."""
    code = checkpoint_code(blocks) if cfg.activation_checkpointing else []
    if sharded(cfg):
        code += shard_code(cfg, blocks)
        code.append("optimizer = torch.optim.AdamW(model.parameters())  # your optimizer, built after "
                    "fully_shard: it takes the shards (DTensors)")
        code.append("# checkpoints: torch.distributed.checkpoint.state_dict.get_model_state_dict(model, "
                    "options=StateDictOptions(full_state_dict=True, cpu_offload=True)) on every rank")
    return code


def _accumulation_lines(cfg: TrialConfig) -> list[str]:
    """The loop of gradient accumulation: the ranks synchronise on the last micro-batch only."""
    n = cfg.grad_accum
    lines = [f"# gradient accumulation: {n} loader batches of {cfg.micro_batch} per optimizer step",
             "for i, (inputs, targets) in enumerate(loader):",
             f"    last = (i + 1) % {n} == 0"]
    if sharded(cfg):
        lines.append("    model.set_requires_gradient_sync(last)  # reduce-scatter on the last only")
        body = "    "
    elif cfg.nprocs > 1:
        lines.append("    with contextlib.nullcontext() if last else model.no_sync():  # all-reduce on the last only")
        body = "        "
    else:
        body = "    "
    lines += [f"{body}loss = loss_fn(model(inputs), targets) / {n}  # the mean over the {n}",
              f"{body}loss.backward()",
              "    if last:",
              "        optimizer.step()",
              "        optimizer.zero_grad()"]
    return lines


def render_snippet(cfg: TrialConfig, baseline: TrialConfig, env: Mapping[str, str], *,
                   blocks: tuple[str, ...] = ()) -> str:
    """The lines that differ from the user's baseline, for a hand-written loop; ``blocks``:
    the model's repeated block classes, which the memory knobs act on."""
    code: list[str] = []
    shell: list[str] = gpu_stacks.snippet_shell(cfg, baseline, env)
    cuda = cfg.device == Device.CUDA
    several = cfg.nprocs > 1
    becomes_ddp = several and baseline.nprocs == 1
    if cfg.threads != baseline.threads and cfg.threads:
        code.append(f"torch.set_num_threads({cfg.threads})  # per process; or OMP_NUM_THREADS={cfg.threads}")
    if cfg.interop_threads != baseline.interop_threads and cfg.interop_threads:
        code.append(f"torch.set_num_interop_threads({cfg.interop_threads})  # before any parallel work")
    if cfg.cudnn_benchmark and not baseline.cudnn_benchmark:
        code.append(f"{CUDNN_BENCHMARK_LINE}  # cuDNN times its algorithms per input shape, keeps the fastest")
    if becomes_ddp:
        code.append(f'torch.distributed.init_process_group("{cfg.backend}")  # under torchrun.sh: '
                    f"{cfg.nprocs} ranks")
        if cuda:
            # Without it every rank would use cuda:0, which NCCL refuses ("Duplicate GPU detected").
            code.append('local_rank = int(os.environ["LOCAL_RANK"])  # set by torchrun')
            code.append("torch.cuda.set_device(local_rank)  # before any CUDA work: one GPU per rank")
    loader_changed = {k: v for k, v in loader_kwargs(cfg).items() if loader_kwargs(baseline).get(k) != v}
    pinned = bool(loader_kwargs(cfg)["pin_memory"])
    new_loader = bool(loader_changed) or cfg.nprocs != baseline.nprocs
    if new_loader:
        if several:
            # DataLoader refuses shuffle=True beside a sampler: the sampler shuffles.
            code.append("sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True)"
                        "  # each rank reads its share")
            code.append(f"loader = torch.utils.data.DataLoader(dataset, sampler=sampler, shuffle=False, "
                        f"{loader_kwargs_text(cfg)})")
            code.append("# a stream (an IterableDataset) takes no sampler: it shards itself by rank, "
                        "see IterableShard in train_tuned.py")
        else:
            code.append(f"loader = torch.utils.data.DataLoader(dataset, shuffle=True, {loader_kwargs_text(cfg)})")
    if cfg.channels_last and not baseline.channels_last:
        code.append("model = model.to(memory_format=torch.channels_last)")
        code.append("# and each image batch: inputs = inputs.to(memory_format=torch.channels_last)")
    if becomes_ddp and cuda:
        code.append("model = model.to(local_rank)")
    code += gpu_stacks.model_code(cfg, baseline, becomes_ddp=becomes_ddp)
    if (cfg.activation_checkpointing, cfg.sharding) != (baseline.activation_checkpointing, baseline.sharding):
        code += _memory_lines(cfg, blocks)
    if becomes_ddp and not sharded(cfg):
        code.append(gpu_stacks.ddp_call(cfg, "device_ids=[local_rank]" if cuda else ""))
    mode = cfg.compile if cfg.compile != CompileMode.OFF else None
    if mode and mode != baseline.compile:
        code.append(f'model = torch.compile(model, mode="{mode}")' if mode != CompileMode.DEFAULT
                    else "model = torch.compile(model)")
    if cfg.precision != baseline.precision:
        if cfg.precision in (Precision.BF16, Precision.FP16):
            dtype = "bfloat16" if cfg.precision == Precision.BF16 else "float16"
            device = "cuda" if cuda else "cpu"
            code.append(f'with torch.autocast("{device}", dtype=torch.{dtype}):  # the forward pass and the loss')
            code.append("    loss = loss_fn(model(inputs), targets)")
            if cfg.precision == Precision.FP16:
                code.append('scaler = torch.amp.GradScaler("cuda")  # scaler.scale(loss).backward(); '
                            "scaler.step(optimizer); scaler.update()")
                code.append("# with gradient clipping: scaler.unscale_(optimizer) first, then "
                            "torch.nn.utils.clip_grad_norm_(...), then scaler.step(optimizer)")
        elif cfg.precision == Precision.TF32:
            code.append(f"{TF32_LINES[0]}  # TF32 matrix products; cuDNN convolutions use TF32 by default")
            code.append(f"{TF32_LINES[1]}  # the legacy flag, in step: torch.compile still reads it")
    if new_loader and (several or (pinned and "pin_memory" in loader_changed)):
        code += _loop_lines(several=several, pinned=pinned, ddp_on_cuda=becomes_ddp and cuda)
    if cfg.grad_accum != baseline.grad_accum and cfg.grad_accum > 1:
        code += _accumulation_lines(cfg)
    code += optimizer.step_code(cfg)
    if cfg.lr_factor != 1.0:
        code.append("for group in optimizer.param_groups:  # --scale-lr "
                    f"{cfg.lr_scaling}: the global batch {cfg.batch_size} over your {cfg.lr_batch}")
        code.append(f"    group['lr'] *= {cfg.lr_factor:g}")
    if cfg.allocator != baseline.allocator and "LD_PRELOAD" in env:
        shell.append(f"export LD_PRELOAD={shlex.quote(env['LD_PRELOAD'])}  # the {cfg.allocator} allocator")
        if "MALLOC_CONF" in env:
            shell.append(f"export MALLOC_CONF={shlex.quote(env['MALLOC_CONF'])}")
    if cfg.threads != baseline.threads and cfg.threads:
        shell.append(f"export OMP_NUM_THREADS={cfg.threads}")
    out = ["# Apply the tuned configuration to your own training loop", "",
           f"Only the lines that differ from your configuration ({baseline.short()}) are here; "
           f"autotune measured {cfg.short()}.", ""]
    if not code and not shell:
        return "\n".join(out + ["Nothing differs: your configuration is the fastest one verified.", ""])
    if shell:
        out += ["Before starting Python:", "", "```bash", *shell, "```", ""]
    if code:
        imports = ["import os"] if any("os.environ" in line for line in code) else []
        imports += ["import contextlib"] if any("contextlib." in line for line in code) else []
        out += ["In the script:", "", "```python", *imports, "import torch", "", *code, "```", ""]
    if cfg.prune_ratio:
        out += [f"Structured pruning ({cfg.prune_ratio:g} of channels) changes the model: train_tuned.py "
                "applies it (prune_model); copy that function to use it.", ""]
    return "\n".join(out)


def _loop_lines(*, several: bool, pinned: bool, ddp_on_cuda: bool) -> list[str]:
    """The training loop's own lines: the sampler's epoch, and the copies pinned memory
    makes asynchronous (pin_memory=True gains nothing with blocking copies)."""
    lines = []
    if pinned:
        lines.append("device = torch.device(\"cuda\", local_rank)" if ddp_on_cuda
                     else "device = torch.device(\"cuda\")")
    lines.append("for epoch in range(epochs):")
    if several:
        lines.append("    sampler.set_epoch(epoch)  # a new order each epoch, the same on every rank")
    lines.append("    for inputs, targets in loader:")
    if pinned:
        lines.append("        inputs = inputs.to(device, non_blocking=True)  # from pinned memory: "
                     "the copy overlaps the GPU's work")
        lines.append("        targets = targets.to(device, non_blocking=True)")
    lines.append("        ...  # your step")
    return lines
