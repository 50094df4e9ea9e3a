"""Does the tuned configuration keep its speed under the user's own stack?

Given an output folder of `autotune run`, trains its model file for the same steps under
(1) the emitted launch.sh (train_tuned.py), (2) Accelerate, started as the emitted
accelerate_config.yaml's header says, with what the file cannot hold applied in the script
as apply_to_your_loop.md says (channels_last, interop threads, the DataLoader's
arguments), (3) a Lightning Trainer built from lightning_trainer.json. Each run alone,
rotating, `--rounds` times; each times its own steady steps (after a warm-up). Prints the
median samples/s of each and its ratio to train_tuned.py's, as JSON.

    python bench/stack_throughput.py autotune-out/fashion_cnn --rounds 3 --steps 60
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import TrialConfig
from autotune.document import paths
from autotune.emit import outputs as emit
from autotune.emit import stacks as stack_configs
from autotune.probes import probe_machine
from autotune.trials import launch

COMMON = '''
import importlib.util, json, os, sys, time
import torch
spec = importlib.util.spec_from_file_location("user", sys.argv[1])
user = importlib.util.module_from_spec(spec); spec.loader.exec_module(user)
cfg = json.load(open(sys.argv[2]))
steps, warm, out = int(sys.argv[3]), 5, sys.argv[4]
if cfg.get("interop_threads"):
    torch.set_num_interop_threads(cfg["interop_threads"])
channels_last = cfg.get("channels_last")
loss_fn = getattr(user, "loss_fn", None) or torch.nn.functional.cross_entropy


def to_format(x):
    if channels_last and torch.is_tensor(x) and x.dim() == 4:
        return x.to(memory_format=torch.channels_last)
    return x


def compute_loss(model, batch):
    if getattr(user, "training_step", None):
        return user.training_step(model, batch)
    inputs, targets = batch
    return loss_fn(model(to_format(inputs)), targets)


def build():
    model = user.build_model()
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
    return model
'''

ACCELERATE = COMMON + '''
from accelerate import Accelerator
accelerator = Accelerator()
model = build()
optimizer = (user.build_optimizer(model.parameters()) if getattr(user, "build_optimizer", None)
             else torch.optim.AdamW(model.parameters(), lr=1e-3))
loader = torch.utils.data.DataLoader(user.build_dataset(), shuffle=True, **cfg["dataloader"])
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
done, start = 0, None
while done < steps:
    for batch in loader:
        with accelerator.autocast():
            loss = compute_loss(model, batch)
        accelerator.backward(loss)
        optimizer.step(); optimizer.zero_grad()
        done += 1
        if done == warm:
            start = time.perf_counter()
        if done == steps:
            break
elapsed = time.perf_counter() - start
if accelerator.is_main_process:
    json.dump({"samples_per_s": (steps - warm) * cfg["batch_size"] / elapsed}, open(out, "w"))
accelerator.wait_for_everyone()
accelerator.end_training()
'''

LIGHTNING = COMMON + '''
import lightning
doc = cfg["lightning"]


class Timer(lightning.Callback):
    def __init__(self):
        self.start = None

    def on_train_batch_end(self, trainer, module, outputs, batch, i):
        if trainer.global_step == warm:
            self.start = time.perf_counter()


class Module(lightning.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = build()

    def training_step(self, batch, i):
        return compute_loss(self.model, batch)

    def configure_optimizers(self):
        return (user.build_optimizer(self.parameters()) if getattr(user, "build_optimizer", None)
                else torch.optim.AdamW(self.parameters(), lr=1e-3))


args = dict(doc["trainer"])
if doc["strategy"]:
    from lightning.pytorch.strategies import DDPStrategy
    args["strategy"] = DDPStrategy(process_group_backend=doc["strategy"]["process_group_backend"])
timer = Timer()
trainer = lightning.Trainer(**args, max_steps=steps, logger=False, enable_checkpointing=False,
                            enable_progress_bar=False, enable_model_summary=False, callbacks=[timer])
loader = torch.utils.data.DataLoader(user.build_dataset(), shuffle=True, **doc["dataloader"])
module = Module()
if doc["compile"]:
    module.model = torch.compile(module.model, mode=doc["compile"]["mode"])
trainer.fit(module, loader)
elapsed = time.perf_counter() - timer.start
if trainer.global_rank == 0:
    json.dump({"samples_per_s": (steps - warm) * cfg["batch_size"] / elapsed}, open(out, "w"))
'''


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    args = p.parse_args()
    doc = json.loads((args.out / "best_config.json").read_text())
    cfg = TrialConfig.from_dict(doc["config"])
    baseline = TrialConfig.from_dict(doc["baseline"]["config"])
    model = paths.model_file(doc, args.out)
    env, _ = launch.environment(cfg, machine=probe_machine())
    work = Path(tempfile.mkdtemp(prefix="stacks-"))
    emit.write_candidate(work / "tuned", cfg=cfg, model_file=model, env=env, description="tuned")
    lightning_doc = stack_configs.lightning_arguments(cfg, baseline, env)
    settings = {**cfg.to_dict(), "dataloader": lightning_doc["dataloader"], "lightning": lightning_doc}
    (work / "cfg.json").write_text(json.dumps(settings))
    (work / "accelerate_train.py").write_text(ACCELERATE)
    (work / "lightning_fit.py").write_text(LIGHTNING)
    (work / "accelerate_config.yaml").write_text(stack_configs.render_accelerate(cfg, baseline, env))
    header = next(line for line in (work / "accelerate_config.yaml").read_text().splitlines()
                  if line.startswith("# Run: "))[len("# Run: "):]
    plain = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}

    def run(name: str, i: int) -> float:
        report = work / f"{name}-{i}.json"
        if name == "train_tuned":
            argv = ["bash", str(work / "tuned" / "launch.sh"), "--max-steps", str(args.steps), "--no-checkpoint",
                    "--report", str(report)]
            run_env = plain
        elif name == "accelerate":
            line = header.replace("your_script.py", " ".join(shlex.quote(str(a)) for a in (
                work / "accelerate_train.py", model, work / "cfg.json", args.steps, report)))
            line = line.replace("accelerate launch", f"{Path(sys.executable).parent / 'accelerate'} launch")
            argv, run_env = ["bash", "-c", line.replace("python -m", f"{sys.executable} -m")], plain
        else:
            argv = [sys.executable, str(work / "lightning_fit.py"), str(model), str(work / "cfg.json"),
                    str(args.steps), str(report)]
            environment = lightning_doc["environment"]
            assert isinstance(environment, Mapping), environment
            run_env = {**plain, **{k: str(v) for k, v in environment.items()}}
        proc = subprocess.run(argv, cwd=work, env=run_env, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise SystemExit(f"{name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        value = json.loads(report.read_text())["samples_per_s"]
        print(f"round {i + 1} {name}: {value:.1f} samples/s", flush=True)
        return value

    names = ["train_tuned", "accelerate", "lightning"]
    values: dict[str, list[float]] = {n: [] for n in names}
    for i in range(args.rounds):
        for name in names[i % 3:] + names[:i % 3]:  # rotating: none always follows another
            values[name].append(run(name, i))
    medians = {n: statistics.median(v) for n, v in values.items()}
    print(json.dumps({"config": cfg.short(), "steps": args.steps, "values": values, "median": medians,
                      "over_train_tuned": {n: medians[n] / medians["train_tuned"] for n in names}}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
