#!/usr/bin/env python3
"""Run your Hugging Face Trainer script with the TrainingArguments autotune verified on
this machine (run_tuned.json, beside this file, says which).

Needs transformers and your script, not autotune: ``tuned_runtime/hf_script.py`` beside it
is the code the trials ran your script with, copied unchanged. For a script that parses its
TrainingArguments (HfArgumentParser), the tuned ones go on its command line as flags; for one
that builds them in code, they are set on its TrainingArguments before they are checked, as if
written there.

    python run_tuned.py                     # your script's training, tuned
    python run_tuned.py --as-written        # your script as it is (the baseline)
    python run_tuned.py -- ARGS             # your script with other arguments, tuned
    python run_tuned.py --max-steps 200 --report report.json   # a timed run, saving nothing
    TUNED_NPROCS=2 python run_tuned.py      # as 2 ranks over loopback (launch.sh sets it where tuned so)
    torchrun --nproc-per-node 2 run_tuned.py   # as 2 ranks under torchrun

A timed run (``--report``, ``--max-steps``) ends once its training has, its report written: nothing your
script does after ``trainer.train()`` runs in it (autotune's standalone runs are timed runs).
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

from tuned_runtime import hf_script, run_tuned_args, script_end, script_ranks  # noqa: E402


def _measure(report: str, steps: int, start_after: str | None):
    """A TrainerCallback that times the steps after the first run_tuned_args.WARM_STEPS and writes what
    autotune reads of a run (its samples per second, losses, the arguments the Trainer ran
    with) to ``report``."""
    from transformers import TrainerCallback

    losses: list[float] = []

    class Measure(TrainerCallback):
        trainer = None

        def on_train_begin(self, args, state, control, **kwargs):
            self.facts = hf_script.trainer_facts(self.trainer)
            if start_after:
                while not os.path.exists(start_after):
                    time.sleep(0.02)
            self.start = None

        def on_step_end(self, args, state, control, **kwargs):
            hf_script.close_step(self.trainer)
            if state.global_step == min(run_tuned_args.WARM_STEPS, steps - 1):
                hf_script.synchronize(self.trainer)
                self.start, self.first = time.perf_counter(), state.global_step

        def on_train_end(self, args, state, control, **kwargs):
            hf_script.synchronize(self.trainer)
            if not state.is_world_process_zero:  # rank 0 reports for the ranks (its batch is theirs)
                return
            timed = state.global_step - self.first if self.start is not None else 0
            elapsed = time.perf_counter() - self.start if self.start is not None else 0.0
            batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
            rate = timed * batch / elapsed if timed > 0 and elapsed > 0 else None
            if rate:
                print(f"{rate:.1f} samples/s over {timed} steps", flush=True)
            with open(report, "w") as f:
                json.dump({"steps": state.global_step, "first_step": 1, "timed_steps": timed,
                           "samples_per_s": rate, "losses": losses, "facts": self.facts}, f)

    measure = Measure()

    def callbacks(trainer):
        measure.trainer = trainer
        hf_script.keep_step_losses(trainer, losses)
        return [measure]

    return callbacks


def main(argv: list[str]) -> int:
    settings, args, rest = run_tuned_args.parse(HERE, argv)
    script = args.script
    tuned = {} if args.as_written else dict(settings.get("overrides", {}))
    overrides: dict = {}
    if rest is not None:  # other arguments: the tuned flags after them, for a script that parses them
        script_argv = rest + (list(settings.get("flags", [])) if settings.get("parsed") and tuned else [])
    elif settings.get("parsed") and tuned:
        script_argv = list(settings["tuned_argv"])  # the script's arguments, the tuned ones in place
    else:
        script_argv = list(settings.get("argv", []))
    if not settings.get("parsed"):
        overrides.update(tuned)
    timed = args.report is not None or args.max_steps is not None
    with tempfile.TemporaryDirectory(prefix="run-tuned-") as tmp:
        if timed:  # nothing saved, pushed or reported; outputs in a folder that goes
            overrides.update({**hf_script.QUIET, "output_dir": tmp})
            if args.max_steps is not None:
                overrides["max_steps"] = args.max_steps
        callbacks = (_measure(args.report, args.max_steps or hf_script.ENDLESS_STEPS, args.start_after)
                     if args.report else (lambda trainer: ()))
        # a timed run ends with its training: nothing after the script's train() runs
        hf_script.install(script, overrides, callbacks,
                          at_end=(lambda: script_end.end_process(tmp)) if timed else None)
        for key, value in settings.get("env_notes", {}).items():
            print(f"run_tuned.py: {key}: {value}", file=sys.stderr)
        script_ranks.join(settings.get("backend", "gloo"))  # ranks launch.sh started: the Trainer's DDP uses it
        hf_script.run_script(script, script_argv)
    script_end.leave_ranks()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
