"""What the user sees: user text is printed as text, never as rich markup."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from autotune.config import TrialConfig
from autotune.document.measures import Rejection
from autotune.report.console import Reporter
from autotune.trials.progress import TrialEnd, TrialStart, TrialWindow, VerifyStep
from autotune.trials.protocol import ProgressEvent, Role
from autotune.trials.runner import TrialResult

from recorded_run import load_doc

MARKUP = "[/data/train] and [bold]x[/]"


def test_user_text_with_brackets_is_printed_as_it_is(capsys):
    reporter = Reporter()
    failed = TrialResult(status="failed", failure="user_error",
                         message=f"FileNotFoundError: {MARKUP}", log_tail=f"line 1\n{MARKUP}")
    reporter.trial_end(failed, None)  # rich's MarkupError here ended whole runs
    reporter.info(f"resuming the study in /tmp/{MARKUP}")
    reporter.warn(f"OMP_NUM_THREADS is set to '{MARKUP}' in your environment")
    reporter.verify(ProgressEvent.STEP, VerifyStep(f"rejected x: {MARKUP}"))
    err = capsys.readouterr().err
    assert err.count(MARKUP) == 5, err


def test_the_summary_prints_paths_and_reasons_as_text(capsys):
    whole = load_doc()
    doc = dataclasses.replace(
        whole, model_file=f"/models/{MARKUP}.py", best=None, speedup=None, config=whole.baseline.config,
        rejected=(Rejection(config=TrialConfig(nprocs=1, threads=2), reason=MARKUP, checks={}),),
        precision=dataclasses.replace(whole.precision, rejected={"bf16": MARKUP}, instead="the baseline"),
        outputs={"config": "best_config.json", "script": "s", "launcher": "l"},
        launch=f"./launch.sh  # runs: {MARKUP}")
    Reporter().details(doc, Path(f"/out/{MARKUP}"))
    out = capsys.readouterr().out.replace("\n", "")
    assert out.count(MARKUP) >= 4, out


def test_the_summary_names_every_file_written_stack_files_included(capsys):
    outputs = {"config": "best_config.json", "script": "train_tuned.py", "launcher": "launch.sh",
               "accelerate": "accelerate_config.yaml", "lightning": "lightning_trainer.json",
               "torchrun": "torchrun.sh", "snippet": "apply_to_your_loop.md"}
    whole = load_doc()
    doc = dataclasses.replace(whole, model_file="m.py", best=None, speedup=None, config=whole.baseline.config,
                              outputs=outputs, launch="./launch.sh  # runs: python train_tuned.py")
    Reporter().details(doc, Path("/out"))
    wrote = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("wrote "))
    assert wrote == "wrote " + ", ".join(f"/out/{name}" for name in outputs.values())


@pytest.mark.slow
def test_progress_through_a_pipe_is_one_line_per_event_however_long(tmp_path):
    """`autotune run ... 2>&1 | cat`: rich wraps at 80 columns when stderr is not a
    terminal; a CI log must keep each event on one line."""
    import subprocess
    import sys

    long_path = "/data/" + "x" * 200
    code = ("from autotune.report.console import Reporter\n"
            "from autotune.trials.runner import TrialResult\n"
            "r = Reporter()\n"
            f"r.info('resuming the study in {long_path}')\n"
            f"r.warn('OMP_NUM_THREADS is set in your environment: {long_path}')\n"
            "r.trial_end(TrialResult(status='ok', value=1234.5, iqr=1.0), 2000.0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "COLUMNS": "80", "TERM": "dumb"})
    lines = out.stderr.splitlines()
    assert len(lines) == 3, lines
    assert lines[0].endswith(long_path) and lines[1].endswith(long_path)


def test_optunas_own_info_lines_stay_out_of_the_progress(tmp_path, capsys):
    import logging

    import optuna

    from autotune.search.tuner import open_study

    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(logging.INFO)
    try:
        open_study(storage_path=tmp_path / "study.journal", study_name="s")
        assert "A new study created" not in capsys.readouterr().err
        assert optuna.logging.get_verbosity() == logging.INFO, "the user's verbosity is restored"
    finally:
        optuna.logging.set_verbosity(before)


def test_at_a_terminal_the_panel_shows_the_configuration_measured_now_against_baseline_and_best():
    import io

    from rich.console import Console

    from autotune.config import TrialConfig
    from autotune.trials.runner import TrialResult

    reporter = Reporter(live=True)
    screen = io.StringIO()
    reporter.err = Console(file=screen, force_terminal=True, width=200, highlight=False, soft_wrap=True)
    baseline, candidate = TrialConfig(batch_size=32), TrialConfig(batch_size=128, precision="bf16")
    reporter.search(ProgressEvent.START, TrialStart(number=1, of=4, config=baseline, role=Role.BASELINE, elapsed=0.0))
    reporter.search(ProgressEvent.END, TrialEnd(result=TrialResult(status="ok", value=1000.0, iqr=1.0), best=1000.0,
                                                role=Role.BASELINE))
    reporter.search(ProgressEvent.START, TrialStart(number=2, of=4, config=candidate, role=None, elapsed=5.0))
    reporter.search(ProgressEvent.WINDOW, TrialWindow(i=0, value=2500.0))
    view = reporter.view
    assert view is not None and view.now == candidate.short() and view.step == "trial 2 of 4"
    assert view.latest == "last window: 2,500 samples/s, 2.50x the baseline", view.latest
    assert view.best == "best so far 1.00x the baseline (1,000 samples/s)"
    reporter.close()
    assert "2.50x the baseline" in screen.getvalue()
    assert "window 1" not in screen.getvalue()  # windows are lines only with -v


def test_the_summary_leads_with_the_speedup_a_rerun_stays_above(capsys):
    whole = load_doc()
    assert whole.speedup is not None
    shift = ("the baseline ran at two speeds, about 14,500 and 19,500 samples/s (3 and 3 of its runs), "
             "from one run to the next: the interval covers a re-run at either speed")
    speedup = dataclasses.replace(whole.speedup, lower_bound=1.62, speed_shift=shift)
    Reporter().details(dataclasses.replace(whole, speedup=speedup), Path("/out"))
    out = " ".join(capsys.readouterr().out.split())
    iv = speedup.interval
    assert (f"speedup 1.62x or more in 95% of re-runs (median {iv.ratio:.2f}x, 95% of re-runs within "
            f"{iv.low:.2f}-{iv.high:.2f}x; 6 pairs of standalone runs)") in out, out
    assert shift in out
