"""The end of a run in one screen, and the run as it goes on a terminal.

The answer first: at most 20 lines of at most 100 columns, whose first 6 hold the verdict and
its figure, the changed knobs, the command to train with and the report's path; everything
else behind `autotune show OUTDIR --details`. On a terminal, one live panel: the stage, the
step, the best so far, the time spent and left (``report.live``); piped, the lines a log
reads. Real runs' answers are checked where those runs are: tests/test_loop_script.py (under
a terminal), test_trainer_script.py, test_lightning_script.py, test_resume.py (a model file).
"""
from __future__ import annotations

import dataclasses
import io
import json
import re
from pathlib import Path

from rich.console import Console

from autotune.cli import main
from autotune.config import TrialConfig
from autotune.document.interval import Interval
from autotune.document.kept import Kept
from autotune.document.measures import Rejection
from autotune.document.run import RunDocument, ScriptRecord
from autotune.report.console import Reporter
from autotune.report.live import LiveView
from autotune.report.summary import MOST_LINES, WIDTH, fit
from autotune.trials.progress import SpeedRound, TrialEnd, TrialStart, TrialWindow, VerifyStep
from autotune.trials.protocol import ProgressEvent, Role
from autotune.trials.runner import TrialResult

from helpers import one_screen
from recorded_run import ABLATION, FIXTURE, load_doc


def written(tmp_path: Path, doc: RunDocument) -> Path:
    """``doc`` in an output folder, as a run leaves it (its launcher and report beside it)."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    doc = dataclasses.replace(doc, outputs=doc.outputs or {"config": "best_config.json", "script": "train_tuned.py",
                                                           "launcher": "launch.sh"})
    (out / "best_config.json").write_text(json.dumps(doc.to_json()))
    (out / "report.html").write_text("<html></html>")
    return out


def printed(doc: RunDocument, folder: Path) -> str:
    reporter = Reporter(live=False)
    reporter.out = Console(file=io.StringIO(), width=WIDTH, highlight=False, soft_wrap=True)
    reporter.summary(doc, folder)
    return reporter.out.file.getvalue()  # type: ignore[attr-defined]


def test_the_answer_opens_with_the_verdict_the_changes_the_command_and_the_report(tmp_path):
    whole = load_doc()
    assert whole.speedup is not None
    doc = dataclasses.replace(whole, ablation=ABLATION, speedup=dataclasses.replace(whole.speedup, lower_bound=1.85))
    out = written(tmp_path, doc)
    lines = one_screen(printed(doc, out), out)
    assert lines[0] == ("verified: 1.85x faster or more (median 2.87x; 95% of re-runs within 1.81-4.73x, "
                        "6 standalone pairs)")
    said = " ".join(lines[1:4])
    # only what changed, each with what the ablation found it worth; the layout as one knob
    assert "layout 1xdefault → 2x1 (1.12x)" in said and "batch_size 64 → 512 (1.41x)" in said
    assert "precision fp32 → bf16 (1.70x)" in said and "allocator default → tcmalloc" in said
    assert "backend" not in said and "ipex" not in said  # unchanged knobs are behind --details
    assert any(line == f"train with: {out / 'launch.sh'}" for line in lines[:6])
    assert any(line == f"report: {out / 'report.html'}" for line in lines[:6])
    # briefly, what it could not do; where everything else is
    [skipped] = [line for line in lines if line.startswith(f"not searched here: {len(doc.excluded)} knobs and values (")]
    # a value not searched is named with its knob: precision was searched, fp16 was not
    assert "precision=fp16" in doc.excluded and "precision" not in doc.excluded
    assert re.search(r"\bprecision\b(?!=)", skipped) is None, skipped
    assert f"({next(iter(doc.excluded))}, " in skipped
    assert lines[-1].startswith(f"everything else: autotune show {out} --details")
    assert "warning: the pairs ranged from 1.96x to 5.03x" in "\n".join(lines)


def test_many_changes_and_long_reasons_still_fit_one_screen_with_the_command_on_it(tmp_path):
    whole = load_doc()
    many = whole.config.replace(compile="default", optimizer_step="fused", grad_accum=2, prefetch_factor=4)
    long = "x" * 300
    doc = dataclasses.replace(
        whole, config=many, ablation=ABLATION,
        rejected=tuple(Rejection(config=TrialConfig(batch_size=b), reason=f"numerics: {long}", checks={})
                       for b in (128, 256, 1024, 2048, 4096)))
    out = written(tmp_path, doc)
    lines = one_screen(printed(doc, out), out)
    assert len(lines) <= MOST_LINES
    command = next(i for i, line in enumerate(lines) if line.startswith("train with: "))
    assert command <= 4 and lines[command - 1].endswith("--details)")  # those left out, counted
    assert sum(line.startswith("rejected ") for line in lines) == 3 and "  and 2 more rejected" in lines


def test_an_answer_that_verified_nothing_says_keep_yours_and_names_the_faster_median(tmp_path):
    whole = load_doc()
    kept = Kept(config=whole.config, launcher="verify/candidate-0/launch.sh",
                interval=Interval(ratio=1.07, low=0.9, high=1.25, level=0.95), pairs=4)
    assert whole.speedup is not None and whole.speedup.lower_bound is None  # a document from before it
    assert printed(whole, written(tmp_path, whole)).startswith("verified: 2.87x faster (the median; a re-run "
                                                                "lands in 1.81-4.73x, 95%; 6 standalone pairs)")
    doc = dataclasses.replace(whole, best=None, speedup=None, config=whole.baseline.config, kept=kept)
    out = written(tmp_path, doc)
    lines = one_screen(printed(doc, out), out)
    assert lines[0] == "not verified: keep yours; the fastest ran 1.07x faster by its median (4 pairs), a re-run 0.90-1.25x"
    assert lines[1] == "change: nothing: your configuration stays as it is"
    assert lines[4] == fit(f"not emitted: {whole.config.short()}") and f"autotune verify {out}" in lines[5]


def test_a_scripts_answer_is_said_in_its_own_terms_on_the_first_screen(tmp_path):
    whole = load_doc()
    script = ScriptRecord(kind="hf_trainer", parsed=True, argv=("--epochs", "1"),
                          arguments={"per_device_train_batch_size": 512},
                          flags=("--per_device_train_batch_size", "512"))
    doc = dataclasses.replace(whole, script=script)
    out = written(tmp_path, doc)
    lines = one_screen(printed(doc, out), out)
    assert "on your script's command line: --per_device_train_batch_size 512" in lines
    assert "as 2 ranks (launch.sh starts them): a per-device batch of 256, the global batch 512" in lines


def test_show_prints_the_answer_and_show_details_everything(tmp_path, capsys):
    out = written(tmp_path, load_doc())
    assert main(["show", str(out)]) == 0
    short = capsys.readouterr().out
    one_screen(short, out)
    assert main(["show", str(out), "--details"]) == 0
    details = capsys.readouterr().out
    # what the summary used to print: every knob, what the figure covers, the knobs not searched
    assert "interop_threads" in details and "measured as you will run it:" in details
    assert "not searched on this machine:" in details and "wrote " in details
    assert "measured as you will run it" not in short and "not searched on this machine" not in short


# --- the live panel

class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def panel(view: LiveView) -> str:
    console = Console(file=io.StringIO(), width=WIDTH, force_terminal=False)
    console.print(view)
    return console.file.getvalue()  # type: ignore[attr-defined]


def test_the_panel_says_the_stage_the_step_the_best_and_the_time_left_from_the_trials_so_far():
    clock = Clock()
    view = LiveView(Console(file=io.StringIO(), force_terminal=True), clock=clock)
    try:
        view.enter("the batch range")
        assert "the batch range" in panel(view) and "known after the first trials" in panel(view)
        view.trial(1, 5, "layout=1x2 batch=64")
        clock.t += 10
        view.trial(2, 5, "layout=2x1 batch=64")
        clock.t += 4
        # 10 s a trial: 6 s of this one left, and 3 more
        assert view.left_s() == 36.0
        shown = panel(view)
        assert "search  trial 2 of 5  layout=2x1 batch=64" in shown
        assert "about 36 s left of the search, then verification" in shown
        # verification priced: its stages counted down, the one under way from when it began
        view.verification({"gates": 30.0, "speed": 20.0, "ablation": 0.0, "standalone": 40.0})
        view.verify_stage("gates")
        clock.t += 10
        assert view.left_s() == 20.0 + 20.0 + 40.0
        view.speed_round(1, 10)
        assert view.stage == "verify: speed side by side" and view.step == "round 1 of at most 10"
        assert view.left_s() == 20.0 + 40.0  # the gates are done once the next stage begins
        # the gates again (the ablation's simplified configuration): nothing is counted twice
        view.verify_stage("gates")
        assert view.left_s() == 20.0 + 40.0
        view.verify_stage("standalone", step="pair 2 of at most 4")
        clock.t += 50  # past its estimate: nothing left of it, never less
        assert view.left_s() == 0.0
        assert "verify: standalone pairs  pair 2 of at most 4" in panel(view)
    finally:
        view.stop()
    # --timeout bounds it
    view = LiveView(Console(file=io.StringIO(), force_terminal=True), clock=clock)
    try:
        view.trial(1, 5, "a")
        clock.t += 10
        view.trial(2, 5, "b")
        assert view.left_s() == 40.0
        view.ends_at = clock.t + 5
        assert view.left_s() == 5.0 and "(--timeout bounds it)" in panel(view)
    finally:
        view.stop()


def terminal_reporter() -> tuple[Reporter, io.StringIO]:
    reporter = Reporter(live=True)
    screen = io.StringIO()
    reporter.err = Console(file=screen, force_terminal=True, width=WIDTH, highlight=False)
    return reporter, screen


def test_on_a_terminal_the_events_feed_the_panel_not_lines_and_warnings_stay_above_it():
    reporter, screen = terminal_reporter()
    reporter.skipping("device=cuda", "no NVIDIA GPU found")
    reporter.info("resuming the study in out (2 trials stored)")
    assert reporter.view is not None and reporter.view.latest == "resuming the study in out (2 trials stored)"
    reporter.search(ProgressEvent.START, TrialStart(number=1, of=3, config=TrialConfig(batch_size=64),
                                                    role=Role.BASELINE, elapsed=1.0))
    reporter.search(ProgressEvent.WINDOW, TrialWindow(0, 500.0))
    ok = TrialResult(status="ok", value=500.0, values=[500.0])
    reporter.search(ProgressEvent.END, TrialEnd(result=ok, role=Role.BASELINE, best=500.0))
    reporter.search(ProgressEvent.START, TrialStart(number=2, of=3, config=TrialConfig(batch_size=128),
                                                    role=None, elapsed=3.0))
    reporter.search(ProgressEvent.END, TrialEnd(result=TrialResult(status="ok", value=650.0, values=[650.0]),
                                                best=650.0))
    assert reporter.view is not None and reporter.view.best.startswith("best so far 1.30x the baseline")
    reporter.verify(ProgressEvent.SPEED, SpeedRound(round=3, rounds=10))
    assert reporter.view.stage == "verify: speed side by side" and reporter.view.step == "round 3 of at most 10"
    reporter.warn("the machine is busy")
    reporter.close()
    shown = screen.getvalue()
    assert "the machine is busy" in shown
    assert "trial 1/3" not in shown and "skipping device=cuda" not in shown  # no per-event lines


def test_piped_or_asked_for_lines_the_events_are_lines_and_no_panel_starts(capsys):
    reporter = Reporter(live=False)
    reporter.search(ProgressEvent.START, TrialStart(number=1, of=3, config=TrialConfig(batch_size=64),
                                                    role=Role.BASELINE, elapsed=1.0))
    reporter.verify(ProgressEvent.STEP, VerifyStep("standalone pair 1 (at most 4): …", stage="standalone",
                                                   step=1, of=4))
    assert reporter.view is None
    err = capsys.readouterr().err
    assert "trial 1/3 (baseline)" in err and "verify: standalone pair 1 (at most 4)" in err
    assert "\x1b[" not in err  # no cursor movement, no colour: a log


def test_run_json_keeps_the_lines_even_on_a_terminal(monkeypatch):
    """--json: the document on stdout, the lines a log reads on stderr, no panel."""
    made = []

    class Seen(Reporter):
        def __init__(self, **kwargs):
            made.append(kwargs)
            super().__init__(**kwargs)

    monkeypatch.setattr("autotune.report.console.Reporter", Seen)

    def stop(*args, **kwargs):
        raise SystemExit(0)

    monkeypatch.setattr("autotune.pipeline.tune", stop)
    for argv, live in ((["run", str(FIXTURE), "--json"], False), (["run", str(FIXTURE)], None)):
        try:
            main(argv)
        except SystemExit:
            pass
        assert made.pop()["live"] is live
