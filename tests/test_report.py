"""What the user sees: user text is printed as text, never as rich markup."""
from __future__ import annotations

from autotune.report import Reporter
from autotune.trial import TrialResult

MARKUP = "[/data/train] and [bold]x[/]"


def test_user_text_with_brackets_is_printed_as_it_is(capsys):
    reporter = Reporter()
    failed = TrialResult(status="failed", failure="user_error",
                         message=f"FileNotFoundError: {MARKUP}", log_tail=f"line 1\n{MARKUP}")
    reporter.trial_end(failed, None)  # rich's MarkupError here ended whole runs
    reporter.info(f"resuming the study in /tmp/{MARKUP}")
    reporter.warn(f"OMP_NUM_THREADS is set to '{MARKUP}' in your environment")
    reporter.verify("step", {"text": f"rejected x: {MARKUP}"})
    err = capsys.readouterr().err
    assert err.count(MARKUP) == 5, err


def test_the_summary_prints_paths_and_reasons_as_text(capsys):
    doc = {"model_file": f"/models/{MARKUP}.py", "verified": False,
           "config": {"precision": "fp32"}, "baseline": {"config": {"precision": "fp32"},
                                                       "samples_per_s": 10.0},
           "rejected": [{"config_short": "layout=1x2", "reason": MARKUP}],
           "precision": {"rejected": {"bf16": MARKUP}, "instead": "the baseline"},
           "outputs": {"config": f"/out/{MARKUP}/best_config.json", "script": "s", "launcher": "l"},
           "launch": f"/out/{MARKUP}/launch.sh"}
    Reporter().summary(doc)
    out = capsys.readouterr().out.replace("\n", "")
    assert out.count(MARKUP) >= 4, out
