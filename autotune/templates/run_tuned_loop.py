#!/usr/bin/env python3
"""Run your training script with what autotune verified on this machine (run_tuned.json,
beside this file, says what): its batch flag on the command line, and its source patched as
``tuned.patch`` says (the same edits, applied as it starts, your file left as it is).

Needs torch and your script, not autotune: ``tuned_runtime/`` beside it holds the code the
trials ran your script with, copied unchanged.

    python run_tuned.py                     # your script's training, tuned
    python run_tuned.py --as-written        # your script as it is (the baseline)
    python run_tuned.py -- ARGS             # your script with other arguments, tuned
    python run_tuned.py --max-steps 200 --report report.json   # a timed run: it ends after 200 steps
    TUNED_NPROCS=2 python run_tuned.py      # as 2 ranks over loopback (launch.sh sets it where tuned so)
    torchrun --nproc-per-node 2 run_tuned.py   # as 2 ranks under torchrun

As ranks, your script's own ``init_process_group`` joins them: over loopback through a file store
(nothing listens), under torchrun as it always does.

A timed run (``--report``, ``--max-steps``) ends once its steps are done, its report written:
nothing your script does after them runs in it (autotune's standalone runs are timed runs). Where
your script trains fewer steps than ``--max-steps``, the report is of the steps it trained.
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

from tuned_runtime import loop_script, run_tuned_args, script_end, script_ranks  # noqa: E402


class Timed:
    """Counts the optimizer's steps; after ``steps`` of them, writes what autotune reads of a
    run (samples per second over the steps after the first run_tuned_args.WARM_STEPS, the losses, what the
    loop ran with) to ``report`` and ends the process."""

    def __init__(self, report: str | None, steps: int | None, start_after: str | None, tmp: str) -> None:
        self.report, self.steps, self.start_after, self.tmp = report, steps, start_after, tmp
        self.losses: list[float] = []
        self.samples = 0
        self.start: float | None = None
        self.first = 0
        self.world = 1

    def begin(self, built) -> None:
        self.world = loop_script.world_size()  # its group is joined by its first forward
        if self.start_after:
            while not os.path.exists(self.start_after):
                time.sleep(0.02)

    def step(self, built, loss: float) -> None:
        self.losses.append(loss)
        loop_script.synchronize(built)
        if self.start is not None:
            self.samples += built.step_samples
        if built.steps == min(run_tuned_args.WARM_STEPS, (self.steps or run_tuned_args.WARM_STEPS + 1) - 1):
            self.start, self.first = time.perf_counter(), built.steps
        if self.steps is not None and built.steps >= self.steps:
            self.end(built)

    def end(self, built) -> None:
        elapsed = time.perf_counter() - self.start if self.start is not None else 0.0
        timed = built.steps - self.first if self.start is not None else 0
        # each rank takes its share of the step: rank 0 reports for the ranks
        rate = self.samples * self.world / elapsed if timed > 0 and elapsed > 0 else None
        facts = loop_script.loop_facts(built)  # every rank: what each ran with is gathered
        if os.environ.get("RANK", "0") != "0":
            script_end.end_process(self.tmp)
        if rate:
            print(f"{rate:.1f} samples/s over {timed} steps", flush=True)
        if self.report:
            with open(self.report, "w") as f:
                json.dump({"steps": built.steps, "first_step": 1, "timed_steps": timed, "samples_per_s": rate,
                           "losses": self.losses, "facts": facts}, f)
        script_end.end_process(self.tmp)


def main(argv: list[str]) -> int:
    settings, args, rest = run_tuned_args.parse(HERE, argv)
    script = args.script
    tuned = not args.as_written
    if rest is not None:  # other arguments: the tuned flag after them
        script_argv = rest + (list(settings.get("flags", [])) if tuned else [])
    else:
        script_argv = list(settings["tuned_argv"] if tuned else settings.get("argv", []))
    edits = settings.get("applied", {}).get("edits", {}) if tuned else {}
    timed = args.report is not None or args.max_steps is not None
    with tempfile.TemporaryDirectory(prefix="run-tuned-") as tmp:
        clock = Timed(args.report, args.max_steps, args.start_after, tmp) if timed else None
        built = loop_script.install(script, on_begin=clock.begin, on_step=clock.step) if clock else None
        script_ranks.join_own_group()  # its init_process_group meets its ranks where they were started
        for key, value in settings.get("env_notes", {}).items():
            print(f"run_tuned.py: {key}: {value}", file=sys.stderr)
        try:
            loop_script.run_script(script, script_argv, edits)
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise
        if clock is not None and built is not None:
            # the script's own training was shorter than --max-steps: what it trained is the timed run
            clock.end(built)
    script_end.leave_ranks()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
