"""The memory knobs take effect: activation checkpointing recomputes the repeated blocks,
gradient accumulation steps once per grad_accum micro-batches, sharding holds each rank's
share of the model (FSDP2); each computes what the model without it computes, to rounding,
in a trial process and in train_tuned.py, and the stack files carry them."""
from __future__ import annotations

import collections
import json
import os

import pytest
import torch

from autotune.config import TrialConfig
from autotune.emit import stacks
from autotune.probes.libraries import find_native_libraries
from autotune.runtime import memory_knobs
from autotune.runtime.distributed import Distributed
from autotune.runtime.model import build_model, make_step
from autotune.runtime.session import load_user_module
from autotune.task import load_task
from autotune.trials.protocol import Measurement
from autotune.trials.runner import TrialRunner

from helpers import MODELS, emit_outputs, machine_doc, pinned_allocator, run_launch_sh

BLOCKS = MODELS / "blocks_mlp.py"
TCMALLOC = find_native_libraries()[0]["tcmalloc"]
# The trials' allocator where the allocator is not the subject (helpers.pinned_allocator)
BASE = TrialConfig(allocator=pinned_allocator())


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.drop = torch.nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.drop(torch.relu(self.linear(x)))


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Linear(4, 8)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.head = torch.nn.Sequential(torch.nn.Linear(8, 2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


# --- which blocks ---------------------------------------------------------------------------------


def test_repeated_blocks_are_the_outermost_repeated_classes_with_modules_of_their_own():
    net = Net()
    assert memory_knobs.repeated_blocks(net) == list(net.blocks)  # not the one head Sequential, not ModuleList
    encoder = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(8, 2, 16), num_layers=3,
                                          enable_nested_tensor=False)
    # the layers, not the attention inside each (a class nested in a chosen one)
    assert memory_knobs.block_names(encoder) == ("TransformerEncoderLayer",)
    assert len(memory_knobs.repeated_blocks(encoder)) == 3
    assert memory_knobs.block_names(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())) == ()


def test_a_sequential_of_blocks_that_hold_sequentials_is_their_container_not_a_block():
    """examples/long_sequences.py's shape: the blocks sit in an nn.Sequential, and each
    holds an nn.Sequential MLP; the blocks are chosen, not the container of all of them."""
    class Mlp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mlp = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU())

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.mlp(x)

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Sequential(Mlp(), Mlp(), Mlp()))
    assert memory_knobs.block_names(model) == ("Mlp",)
    assert memory_knobs.repeated_blocks(model) == list(model[1])


@pytest.mark.slow
def test_the_contract_check_names_the_block_classes():
    assert load_task(BLOCKS).blocks == ("Block",)


def test_checkpointing_a_model_without_blocks_is_a_clear_error_naming_it():
    plain = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="activation_checkpointing: the model Sequential has no repeated blocks"):
        memory_knobs.checkpoint_activations(plain)


# --- activation checkpointing, in this process --------------------------------------------------


def _grads(model: torch.nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    torch.manual_seed(3)  # dropout's draws
    model(x).square().mean().backward()
    return {n.replace(memory_knobs.CHECKPOINT_PREFIX, ""): p.grad for n, p in model.named_parameters()}


def test_checkpointing_recomputes_each_block_with_the_plain_gradients_and_names():
    torch.manual_seed(0)
    plain = Net()
    wrapped = Net()
    wrapped.load_state_dict(plain.state_dict())
    assert memory_knobs.checkpoint_activations(wrapped) == 3
    calls = collections.Counter()
    for i, block in enumerate(memory_knobs.inner_blocks(wrapped)):
        block.register_forward_pre_hook(lambda m, a, i=i: calls.update([i]))
    x = torch.randn(5, 4)
    expected, got = _grads(plain, x), _grads(wrapped, x)
    assert calls == {0: 2, 1: 2, 2: 2}  # the forward, and again in the backward pass
    assert got.keys() == expected.keys()
    for name in expected:  # dropout draws the same in the recomputation: exact
        assert torch.equal(got[name], expected[name]), name
    # a checkpoint of the wrapped model loads into the user's plain model
    assert list(wrapped.state_dict()) == list(plain.state_dict())
    Net().load_state_dict(wrapped.state_dict())


# --- gradient accumulation, in this process -----------------------------------------------------


def test_micro_batches_split_every_tensor_along_dim_0():
    Pair = collections.namedtuple("Pair", "x y")
    batch = {"x": torch.arange(8).reshape(4, 2), "y": [torch.arange(4), 7], "p": Pair(torch.ones(4), "t"),
             "scale": torch.tensor(2.0)}
    parts = memory_knobs.micro_batches(batch, 2)
    assert len(parts) == 2
    assert parts[1]["x"].tolist() == [[4, 5], [6, 7]] and parts[0]["y"][0].tolist() == [0, 1]
    assert parts[0]["y"][1] == 7 and isinstance(parts[0]["p"], Pair) and parts[0]["p"].y == "t"
    assert parts[1]["scale"].item() == 2.0  # a scalar goes whole into each
    with pytest.raises(ValueError, match=r"grad_accum=3: a batch tensor of shape \(4, 2\) does not split"):
        memory_knobs.micro_batches(torch.zeros(4, 2), 3)


def _train(cfg: dict, user, batches) -> tuple[list[float], list[int]]:
    torch.manual_seed(0)
    dist = Distributed({})
    model, optimizer, _ = build_model(user, cfg, dist, batches[0])
    step = make_step(user, model, optimizer, cfg, dist.device)
    return [float(step(b)) for b in batches], [p.numel() for p in model.parameters()]


def test_accumulation_gives_the_losses_of_one_step_and_the_step_sees_micro_batches():
    user = load_user_module(str(BLOCKS))
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(16, 16, generator=g), torch.randint(0, 4, (16,), generator=g)) for _ in range(4)]
    whole, _ = _train({"batch_size": 16}, user, batches)
    seen = []

    class Stepping:  # the user's training_step gets each micro-batch
        build_model = user.build_model
        build_optimizer = user.build_optimizer

        @staticmethod
        def training_step(model, batch):
            seen.append(batch[0].shape[0])
            return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])

    accumulated, _ = _train({"batch_size": 16, "grad_accum": 4}, Stepping, batches)
    assert seen == [4] * 16
    assert accumulated == pytest.approx(whole, rel=1e-5, abs=1e-6)  # to fp32 rounding: sums in another order


def test_fp16_accumulation_scales_every_backward_and_steps_once():
    user = load_user_module(str(BLOCKS))
    calls = collections.Counter()

    class Spy(torch.amp.GradScaler):
        def scale(self, outputs):
            calls["scale"] += 1
            return super().scale(outputs)

        def step(self, optimizer, *args, **kwargs):
            calls["step"] += 1
            return super().step(optimizer, *args, **kwargs)

    cfg = {"batch_size": 16, "grad_accum": 4, "precision": "fp16"}
    dist = Distributed({})
    model, optimizer, _ = build_model(user, cfg, dist, None)
    step = make_step(user, model, optimizer, cfg, dist.device, scaler=Spy("cpu"))
    step((torch.randn(16, 16), torch.randint(0, 4, (16,))))
    assert calls == {"scale": 4, "step": 1}


# --- the stack files carry them -------------------------------------------------------------------


SHARDED = TrialConfig(nprocs=2, threads=1, batch_size=32, grad_accum=2, sharding="grad-op",
                      activation_checkpointing=True)
BASELINE = TrialConfig(batch_size=32)


def test_accelerate_shards_with_fsdp2_over_the_blocks_and_accumulates():
    text = stacks.render_accelerate(SHARDED.replace(device="cuda", backend="nccl"), BASELINE, {}, blocks=("Block",))
    assert 'distributed_type: "FSDP"' in text
    for line in ("  fsdp_version: 2", "  fsdp_reshard_after_forward: false",
                 '  fsdp_auto_wrap_policy: "TRANSFORMER_BASED_WRAP"', '  fsdp_transformer_layer_cls_to_wrap: "Block"',
                 "  fsdp_activation_checkpointing: true", '  fsdp_state_dict_type: "FULL_STATE_DICT"'):
        assert line in text.splitlines(), line
    run = next(line for line in text.splitlines() if line.startswith("# Run: "))
    assert "ACCELERATE_GRADIENT_ACCUMULATION_STEPS=2" in run
    assert "DataLoader batches of 8, 2 per optimizer step" in text  # 32 / (2 ranks x 2)
    # On CPU Accelerator() takes no FSDP (MULTI_CPU wins, with DDP): the file shards in the
    # script, checkpointing first, and prepares the rest (trained in test_stack_configs.py)
    cpu = stacks.render_accelerate(SHARDED, BASELINE, {}, blocks=("Block",))
    run = next(line for line in cpu.splitlines() if line.startswith("# Run: "))
    assert "ACCELERATE_USE_FSDP" not in run and "FSDP" not in cpu.split("# Run: ")[0]
    assert 'distributed_type: "MULTI_CPU"' in cpu and "fsdp_config" not in cpu
    assert ("# Not expressible here, do it in your script: sharding (grad-op) of Block, activation checkpointing: "
            "Accelerate runs FSDP on GPUs only") in cpu
    code = [line[len("#     "):] for line in cpu.splitlines() if line.startswith("#     ")]
    compile("\n".join(code), "accelerate_config.yaml", "exec")
    assert code.index("fully_shard(model, reshard_after_forward=False)  # then the rest") > next(
        i for i, line in enumerate(code) if line.startswith("apply_activation_checkpointing(model"))
    assert any(line.startswith("optimizer, loader = accelerator.prepare(optimizer, loader)") for line in code)
    assert "model.set_requires_gradient_sync(accelerator.sync_gradients)" in cpu
    # checkpointing without sharding: Accelerate holds it only in its FSDP settings
    alone = stacks.render_accelerate(BASELINE.replace(activation_checkpointing=True), BASELINE, {}, blocks=("Block",))
    assert "# Not expressible here, do it in your script: activation checkpointing of Block" in alone


def test_lightning_shards_with_its_fsdp_strategy_and_accumulates_grad_batches():
    doc = stacks.lightning_arguments(SHARDED.replace(device="cuda", backend="nccl"), BASELINE, {}, blocks=("Block",))
    assert doc["trainer"]["strategy"] == "fsdp" and doc["trainer"]["accumulate_grad_batches"] == 2
    strategy = doc["strategy"]
    assert strategy["class"] == "lightning.pytorch.strategies.FSDPStrategy"
    assert strategy["sharding_strategy"] == "SHARD_GRAD_OP"
    assert strategy["auto_wrap_policy"] == ["Block"] and strategy["activation_checkpointing_policy"] == ["Block"]
    assert doc["dataloader"]["batch_size"] == 8
    full = stacks.lightning_arguments(SHARDED.replace(sharding="full", activation_checkpointing=False,
                                                      device="cuda", backend="nccl"),
                                      BASELINE, {}, blocks=("Block",))
    assert full["strategy"]["sharding_strategy"] == "FULL_SHARD"
    assert "activation_checkpointing_policy" not in full["strategy"]


def test_lightning_shards_on_cpu_with_model_parallel_in_configure_model():
    """FSDPStrategy refuses accelerator="cpu": FSDP2 there is ModelParallelStrategy's, with
    the lines for configure_model() (trained in test_stack_configs.py)."""
    doc = stacks.lightning_arguments(SHARDED, BASELINE, {}, blocks=("Block",))
    assert doc["trainer"]["strategy"] == "ModelParallelStrategy" and doc["trainer"]["accumulate_grad_batches"] == 2
    strategy = doc["strategy"]
    assert strategy["class"] == "lightning.pytorch.strategies.ModelParallelStrategy"
    assert (strategy["data_parallel_size"], strategy["tensor_parallel_size"]) == (2, 1)
    assert strategy["process_group_backend"] == "gloo" and strategy["save_distributed_checkpoint"] is False
    code = strategy["configure_model"]
    compile("\n".join(code), "configure_model", "exec")
    assert 'fully_shard(model, mesh=self.device_mesh["data_parallel"], reshard_after_forward=False)' in "\n".join(code)
    assert any(line.startswith("apply_activation_checkpointing(model") for line in code)
    assert doc["not_expressible"] == []  # checkpointing is in configure_model


def test_the_snippet_shards_checkpoints_and_accumulates_in_valid_python():
    snippet = stacks.render_snippet(SHARDED, BASELINE, {}, blocks=("Block",))
    code = "\n".join(part.split("```")[0] for part in snippet.split("```python\n")[1:])
    compile(code, "snippet", "exec")
    assert "fully_shard(block, reshard_after_forward=False)" in code
    assert "isinstance(m, (Block,))" in code and "CheckpointImpl.NO_REENTRANT" in code
    assert "model.set_requires_gradient_sync(last)" in code and "/ 2" in code
    assert "DistributedDataParallel(model)" not in code  # sharding replaces DDP
    ddp = stacks.render_snippet(TrialConfig(nprocs=2, batch_size=32, grad_accum=4), BASELINE, {})
    assert "model.no_sync()" in ddp and "DistributedDataParallel(model)" in ddp


# --- in a trial process and in train_tuned.py (real processes) ----------------------------------

QUICK = Measurement(warmup_steps=2, window_s=0.2, windows=1)


@pytest.fixture(scope="module")
def runner(tmp_path_factory):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 usable cores")
    trials = TrialRunner(model_file=BLOCKS, machine={**machine_doc(), "allocators": {"tcmalloc": TCMALLOC}},
                         workdir=tmp_path_factory.mktemp("trials"), measurement=QUICK, timeout_s=150, hang_s=60)
    yield trials
    trials.close()


def _ok(result):
    assert result.status == "ok", f"{result.failure}: {result.message}\n{result.log_tail}"
    return result


def _same_steps(a: list[float], b: list[float]) -> tuple[list[float], list[float]]:
    """Two measurements' window losses over the steps both ran: the windows start after the
    same warm-up steps, and each trial sizes its windows on its own."""
    n = min(len(a), len(b))
    assert n >= 1
    return a[:n], b[:n]


@pytest.mark.slow
def test_each_knob_takes_effect_in_a_trial_process_and_trains_the_plain_models_losses(runner):
    one = BASE.replace(threads=1, batch_size=16)
    plain = _ok(runner.run(one, name="plain")).losses
    checkpointed = _ok(runner.run(one.replace(activation_checkpointing=True), name="ac"))
    assert checkpointed.facts["checkpointed_blocks"] == 4
    assert checkpointed.facts["block_calls"] == 8  # 4 blocks, each again in the backward pass
    got, expected = _same_steps(checkpointed.losses, plain)
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)

    accumulated = _ok(runner.run(one.replace(grad_accum=4), name="accum"))
    facts = accumulated.facts
    assert facts["model_calls"] == 4 and facts["micro_batch"] == 4 and facts["per_rank_batch"] == 16
    got, expected = _same_steps(accumulated.losses, plain)
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)

    two = BASE.replace(nprocs=2, threads=1, batch_size=16)
    replicated = _ok(runner.run(two, name="ddp"))
    sharded = _ok(runner.run(two.replace(sharding="full", grad_accum=2), name="fsdp"))
    facts = sharded.facts
    assert facts["sharded"] is True and facts["ddp"] is False and facts["parameter_share"] == 0.5
    assert facts["micro_batch"] == 4  # 16 / (2 ranks x 2 micro-batches)
    got, expected = _same_steps(sharded.losses, replicated.losses)
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-6)


@pytest.mark.slow
def test_a_sharded_trials_evaluate_gets_the_gathered_weights(runner):
    ddp = BASE.replace(nprocs=2, threads=1, batch_size=16)
    replicated = _ok(runner.run(ddp, name="ddp-q", quality_steps=5))
    for sharding in ("full", "grad-op"):
        cfg = ddp.replace(sharding=sharding)
        assert _ok(runner.run(cfg, name=f"{sharding}-m")).facts["sharded"] is True
        sharded = _ok(runner.run(cfg, name=f"{sharding}-q", quality_steps=5))
        assert sharded.losses == pytest.approx(replicated.losses, rel=1e-5, abs=1e-6), sharding
        # rank 0's evaluate() on a plain copy with the weights every rank gathered
        assert sharded.done.metric == pytest.approx(replicated.done.metric, abs=1e-6)


# Sharding's memory: measured under tcmalloc. Under glibc's malloc a sharded rank can hold
# MORE than a DDP rank: FSDP's all-gather buffers, freed and reallocated each block, fragment
# glibc's per-thread arenas (MALLOC_ARENA_MAX=1 brings it back under DDP). tcmalloc reuses
# them, so what a rank holds is its share of weights, gradients and AdamW's state.


@pytest.mark.slow
@pytest.mark.skipif(TCMALLOC is None, reason="tcmalloc is not installed (CI installs it: see .ci/run)")
def test_a_sharded_rank_holds_less_than_a_replicated_one(tmp_path):
    trials = TrialRunner(model_file=BLOCKS, machine={**machine_doc(), "allocators": {"tcmalloc": TCMALLOC}},
                         workdir=tmp_path, measurement=QUICK, timeout_s=200, hang_s=90)
    wide = {"BLOCKS_WIDTH": "2048"}  # the weights and AdamW's state dominate what a rank holds
    try:
        ddp = TrialConfig(nprocs=2, threads=1, batch_size=16, allocator="tcmalloc")
        replicated = _ok(trials.run(ddp, name="ddp", extra_env=wide))
        sharded = _ok(trials.run(ddp.replace(sharding="full"), name="fsdp", extra_env=wide))
    finally:
        trials.close()
    assert sharded.facts["parameter_share"] == 0.5
    # the busiest rank's peak as the trial reports it (what --memory-limit bounds): exact,
    # where the runner's samples of the process tree can miss a short trial's
    assert sharded.summary()["rank_peak_mb"] < replicated.summary()["rank_peak_mb"]


@pytest.mark.slow
def test_train_tuned_applies_the_knobs_and_a_sharded_checkpoint_loads_into_the_plain_model(
        tmp_path, no_autotune_env):
    def train(cfg: TrialConfig, name: str, *args: str) -> dict:
        out = tmp_path / name
        emit_outputs(out, cfg, BLOCKS)
        run_launch_sh(out, tmp_path / f"{name}-work", no_autotune_env, "--log-every", "1", "--no-evaluate",
                      "--report", "r.json", *args)
        return json.loads((tmp_path / f"{name}-work" / "r.json").read_text())

    ddp = TrialConfig(nprocs=2, threads=1, batch_size=16)
    replicated = train(ddp, "ddp", "--max-steps", "6", "--no-checkpoint")
    accumulated = train(ddp.replace(grad_accum=2, activation_checkpointing=True), "accum", "--max-steps", "6",
                        "--no-checkpoint")
    assert accumulated["facts"]["micro_batch"] == 4 and accumulated["facts"]["checkpointed_blocks"] == 4
    # the busiest rank's peak, which autotune's memory report takes from the emitted script run alone
    assert replicated["rank_peak_mb"] > 100 and accumulated["rank_peak_mb"] > 100
    assert accumulated["losses"] == pytest.approx(replicated["losses"], rel=1e-5, abs=1e-6)

    # checkpointed too: the checkpoint's names are the user's through both wrappers
    sharded_cfg = ddp.replace(sharding="full", activation_checkpointing=True)
    sharded = train(sharded_cfg, "fsdp", "--max-steps", "6", "--checkpoint-every", "3")
    assert sharded["facts"]["sharded"] is True and sharded["facts"]["parameter_share"] == 0.5
    assert sharded["facts"]["checkpointed_blocks"] == 4
    assert sharded["losses"] == pytest.approx(replicated["losses"], rel=1e-5, abs=1e-6)
    checkpoints = tmp_path / "fsdp-work" / "checkpoints"
    state = torch.load(checkpoints / "step-000000003.pt", weights_only=False)
    user = load_user_module(str(BLOCKS))
    model = user.build_model()
    model.load_state_dict(state["model"])  # the user's names, whole tensors
    optimizer = user.build_optimizer(model.parameters())
    optimizer.load_state_dict(state["optimizer"])  # torch's own format, the whole state
    assert all(s["step"] == 3 for s in optimizer.state_dict()["state"].values())
    # resumed at step 3 from the sharded checkpoint: the uninterrupted run's losses
    for name in os.listdir(checkpoints):
        if name != "step-000000003.pt":
            (checkpoints / name).unlink()
    out = tmp_path / "fsdp"
    proc = run_launch_sh(out, tmp_path / "fsdp-work", no_autotune_env, "--resume", "--max-steps", "6",
                         "--log-every", "1", "--no-evaluate", "--report", "b.json")
    assert "resumed from" in proc.stdout
    resumed = json.loads((tmp_path / "fsdp-work" / "b.json").read_text())
    assert resumed["losses"] == pytest.approx(sharded["losses"][3:], rel=1e-5, abs=1e-6)
