#!/usr/bin/env python3
"""Run your Lightning script with the Trainer and DataLoader arguments autotune verified on
this machine (run_tuned.json, beside this file, says which).

Needs lightning and your script, not autotune: ``tuned_runtime/lightning_script.py`` beside it
is the code the trials ran your script with, copied unchanged. It sets the tuned Trainer
arguments as if written in your ``Trainer(...)``, makes your training DataLoader again with
the tuned workers, pinning and prefetch, sets the batch size where Lightning's batch-size
finder would (your ``batch_size`` attribute), and compiles your LightningModule where tuned.

    python run_tuned.py                     # your script's training, tuned
    python run_tuned.py --as-written        # your script as it is (the baseline)
    python run_tuned.py -- ARGS             # your script with other arguments, tuned
    python run_tuned.py --max-steps 200 --report report.json   # a timed run, saving nothing
    TUNED_NPROCS=2 python run_tuned.py      # as 2 ranks over loopback (launch.sh sets it where tuned so)

A timed run (``--report``, ``--max-steps``) ends once its training has, its report written: nothing your
script does after ``trainer.fit()`` runs in it (autotune's standalone runs are timed runs).
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from tuned_runtime import ranks  # noqa: E402  (beside this file)

# Before torch is imported: with TUNED_NPROCS (launch.sh, tuned as several ranks) this process only
# starts the ranks over loopback and leaves as they did; a rank pins its cores first.
ranks.bootstrap()

from tuned_runtime import lightning_script, run_tuned_args, script_end, script_ranks  # noqa: E402


def _measure(pl, report: str, steps: int, start_after: str | None):
    """A Callback that times the optimizer steps after the first run_tuned_args.WARM_STEPS and writes what
    autotune reads of a run (its samples per second, losses, the arguments the Trainer and its
    DataLoader ran with) to ``report``."""
    losses: list[float] = []
    pending: list[float] = []

    class Measure(pl.Callback):
        start = None
        first = 0

        def on_train_start(self, trainer, pl_module):
            self.facts = lightning_script.trainer_facts(trainer)
            if start_after:
                while not os.path.exists(start_after):
                    time.sleep(0.02)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            loss = lightning_script.step_loss(outputs)
            if loss is not None:
                pending.append(float(loss))
            if len(losses) == trainer.global_step:
                return  # accumulating: the optimizer has not stepped yet
            losses.append(sum(pending) / len(pending) if pending else float("nan"))
            pending.clear()
            if trainer.global_step == min(run_tuned_args.WARM_STEPS, steps - 1):
                lightning_script.synchronize(trainer)
                self.start, self.first = time.perf_counter(), trainer.global_step

        def on_train_end(self, trainer, pl_module):
            lightning_script.synchronize(trainer)
            if trainer.global_rank != 0:  # rank 0 reports for the ranks (its batch is theirs)
                return
            timed = trainer.global_step - self.first if self.start is not None else 0
            elapsed = time.perf_counter() - self.start if self.start is not None else 0.0
            batch = lightning_script.global_batch(trainer)
            rate = timed * batch / elapsed if timed > 0 and elapsed > 0 else None
            if rate:
                print(f"{rate:.1f} samples/s over {timed} steps", flush=True)
            with open(report, "w") as f:
                json.dump({"steps": trainer.global_step, "first_step": 1, "timed_steps": timed,
                           "samples_per_s": rate, "losses": losses, "facts": self.facts}, f)

    return Measure()


def main(argv: list[str]) -> int:
    settings, args, rest = run_tuned_args.parse(HERE, argv)
    script = args.script
    overrides = {} if args.as_written else json.loads(json.dumps(settings.get("overrides", {})))
    timed = args.report is not None or args.max_steps is not None
    pl = lightning_script.package(settings.get("source_module", "lightning"))
    with tempfile.TemporaryDirectory(prefix="run-tuned-") as tmp:
        if args.max_steps is not None:
            overrides.setdefault("trainer", {})["max_steps"] = args.max_steps
        steps = args.max_steps or lightning_script.ENDLESS
        callbacks = (lambda trainer: [_measure(pl, args.report, steps, args.start_after)]) if args.report else (
            lambda trainer: [])
        # a timed run logs, saves and validates nothing, in a folder that goes
        lightning_script.install(script, overrides, callbacks, source_module=settings.get("source_module", "lightning"),
                                 quiet=timed, out_dir=tmp,
                                 at_end=(lambda: script_end.end_process(tmp)) if timed else None)
        for key, value in settings.get("env_notes", {}).items():
            print(f"run_tuned.py: {key}: {value}", file=sys.stderr)
        script_ranks.join(settings.get("backend", "gloo"))  # ranks launch.sh started: Lightning's DDP uses it
        lightning_script.run_script(script, rest if rest is not None else list(settings.get("argv", [])))
    script_end.leave_ranks()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
