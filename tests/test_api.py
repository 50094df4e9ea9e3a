"""The Python API: autotune.tune / load / probe, the same run as the CLI; the document a
real run writes conforms to its schema (tests/test_schemas.py checks the rest)."""
from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

import autotune
from autotune import schemas
from autotune.document.run import RunDocument
from autotune.errors import UsageError
from autotune.trials import forkserver

from helpers import MODELS, knob_cnn, pinned_allocator

# One xdist worker runs this module: its module fixture runs once (README: pytest -n 2).
pytestmark = pytest.mark.xdist_group("api")


def test_load_reads_a_run_and_refuses_what_it_cannot_read(tmp_path):

    from doubles import StandInRunner, recorded_machine, tune_stand_in

    tune_stand_in(knob_cnn(), tmp_path, StandInRunner(recorded_machine("avx2_epyc")))
    doc = json.loads((tmp_path / "out" / "best_config.json").read_text())
    result = autotune.load(tmp_path / "out")
    assert result.verified and result.config == autotune.TrialConfig.from_dict(doc["config"])
    assert result.speedup.median == pytest.approx(doc["speedup"]["median"])
    assert "pairs of standalone runs" in str(result.speedup)
    assert result.speedup.lower == pytest.approx(doc["speedup"]["lower_bound"])
    assert str(result.speedup).startswith(f"{result.speedup.lower:.2f}x or more in 95% of re-runs")
    assert result.launcher == tmp_path / "out" / "launch.sh" and result.launcher.exists()
    assert autotune.load(tmp_path / "out" / "best_config.json") == result

    (tmp_path / "newer.json").write_text(json.dumps({**doc, "schema": 99}))
    with pytest.raises(UsageError, match="newer autotune"):
        autotune.load(tmp_path / "newer.json")
    (tmp_path / "edited.json").write_text(json.dumps({**doc, "speedup": {**doc["speedup"], "median": "fast"}}))
    with pytest.raises(UsageError, match="at speedup.median, 'fast' is not of type 'number'"):
        autotune.load(tmp_path / "edited.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(UsageError, match="not valid JSON"):
        autotune.load(tmp_path / "broken.json")
    with pytest.raises(UsageError, match="no such file"):
        autotune.load(tmp_path / "nowhere")


def test_tune_takes_keywords_only_and_names_an_unknown_option():
    with pytest.raises(TypeError):
        autotune.tune(MODELS / "tiny_cnn.py", 3)
    with pytest.raises(UsageError, match="unknown option windoww.*window_s"):
        autotune.tune(MODELS / "tiny_cnn.py", windoww=1.0)
    with pytest.raises(UsageError, match="unknown knob"):
        autotune.tune(MODELS / "tiny_cnn.py", fix={"batchsize": 64})


def test_one_pair_of_standalone_runs_is_refused_before_anything_runs(tmp_path):
    """The speedup's interval needs two pairs: one crashed verification at its very end."""
    with pytest.raises(UsageError, match="--pairs 1: at least 2"):
        autotune.tune(MODELS / "tiny_cnn.py", pairs=1, out=tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_importing_autotune_loads_neither_optuna_nor_torch():
    """Every trial process imports the package for its runtime: it must stay light."""
    code = "import sys, autotune; print('optuna' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


# The shared run's model: its candidates with DataLoader workers are clearly faster, as
# sleeps set, so every stage of the verification settles at its fewest rounds and
# pairs; a model whose candidates are marginal takes the standalone pairs to their limit.
# (The examples, transformers' among them, run the whole pipeline in test_examples.py and
# on the simulated GPU nodes of test_landscape.py.)
TUNED = MODELS / "slow_loading.py"
BATCH = 16  # the model file's own: no batch range to measure


@pytest.fixture(scope="module")
def tuned(tmp_path_factory) -> SimpleNamespace:
    """One real run through the API, shared by the tests below: what tune() returned, the
    folder it wrote and what it printed on stderr. Three trials, short windows; the knobs that
    only lengthen the verification are fixed (compile, several ranks, allocators, pinning, the
    optimizer's step, and precision: the gates run for real in tests/test_precision.py; the batch, whose range
    measurement and check tests/test_batch_judged.py runs)."""
    out = tmp_path_factory.mktemp("tune") / "out"
    printed = io.StringIO()
    spawned: list[tuple[int, str]] = []  # each forked process: its warm interpreter's pid, its module
    real_spawn = forkserver.ForkServer.spawn

    def spawn(server, module, *args, **kwargs):
        spawned.append((server.proc.pid, module))
        return real_spawn(server, module, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patched, contextlib.redirect_stderr(printed):
        patched.setattr(forkserver.ForkServer, "spawn", spawn)
        result = autotune.tune(
            TUNED, trials=3, out=out, progress=False,
            fix={"nprocs": 1, "compile": "off", "allocator": pinned_allocator(), "affinity": "none", "precision": "fp32",
                 "optimizer_step": "default", "batch_size": BATCH},
            window_s=0.2, windows=2, rounds=2, pairs=2, pair_seconds=0.5, trial_timeout_s=120)
    return SimpleNamespace(result=result, out=out, printed=printed.getvalue(), spawned=spawned)


@pytest.mark.slow
@pytest.mark.timeout(600)  # the verification runs the scripts alone
def test_tune_writes_what_the_cli_writes_and_returns_it(tuned):
    result = tuned.result
    assert result == autotune.load(tuned.out)
    assert {p.name for p in tuned.out.iterdir()} >= {
        "best_config.json", "train_tuned.py", "launch.sh", "trials", "study.journal"}
    assert result.config.nprocs == 1 and result.config.compile == "off"
    assert result.verified and result.config.num_workers > 0, "the candidate with workers, clearly faster, was not verified"
    assert result.speedup is not None and result.speedup.lower > 1
    assert tuned.printed == "", "progress=False prints nothing"


@pytest.mark.slow
@pytest.mark.timeout(600)  # the shared run, where this test is the first to need it
def test_the_first_trial_forks_from_the_interpreter_the_check_warmed(tuned):
    """The check's warm interpreter (torch imported) becomes the trials': the baseline's trial,
    in the user's environment as the check was, forks from it rather than import torch again."""
    checks = [pid for pid, module in tuned.spawned if module == "autotune.task.check"]
    trials = [pid for pid, module in tuned.spawned if module == "autotune.trials.worker"]
    assert len(checks) == 1 and trials and trials[0] == checks[0], tuned.spawned


@pytest.mark.slow
@pytest.mark.timeout(600)  # the shared run, where this test is the first to need it
def test_a_real_runs_whole_document_conforms_and_reads_back(tuned):
    doc = json.loads((tuned.out / "best_config.json").read_text())
    assert schemas.problem(doc, "best_config") is None
    assert RunDocument.from_json(doc).to_json() == doc
    # the options the run was given, each by its name, the database URL (a secret) left out
    assert doc["options"]["trials"] == 3 and doc["options"]["pair_seconds"] == 0.5
    assert doc["options"]["fixed"]["batch_size"] == BATCH
    assert "storage" not in doc["options"]


@pytest.mark.slow
@pytest.mark.timeout(600)  # the shared run, where this test is the first to need it
def test_the_report_shows_where_the_picks_step_goes(tuned):
    """After verification the emitted script ran one window under torch.profiler: its
    shares are in best_config.json, add up to the step its own clock measured, and the
    report's table and advice show them."""
    profile = json.loads((tuned.out / "best_config.json").read_text())["step_profile"]
    assert profile["device"] == "cpu" and profile["source"] == "cpu ops" and profile["steps"] >= 5
    shares = profile["shares"]
    assert sum(shares.values()) * profile["step_ms"] == pytest.approx(profile["measured_step_ms"], rel=0.1)
    assert shares["matmul"] > 0 and shares["optimizer"] > 0 and shares["communication"] == 0
    assert tuned.result.document["step_profile"] == profile
    report = (tuned.out / "report.md").read_text()
    assert "Where the step goes" in report and "matrix products (mm, linear)" in report
    assert "where the step goes (" in report  # the advice's line
    assert (tuned.out / "profile" / "script-log.txt").is_file()
def test_a_real_runs_summary_shows_the_baselines_and_the_picks_share_of_the_measured_peak(tuned):
    """The FLOPs per sample the trials counted, times the measured samples/s, against the
    fp32 matmul peak measured in the trials with their threads."""
    from autotune.report.console import Reporter

    doc = RunDocument.from_json(json.loads((tuned.out / "best_config.json").read_text()))
    found = doc.utilisation
    assert found is not None and found.flops_per_sample > 0
    shares = [found.baseline, found.pick] if doc.verified else [found.baseline]
    for share in shares:
        assert share is not None and share.peak_source.startswith("measured:cpu fp32 matmul, ")
        assert 0 < share.share < 1.5, "a CPU's matmul peak is about the most a step reaches"
    printed = io.StringIO()
    reporter = Reporter()
    reporter.out.file = printed
    reporter.details(doc, tuned.out)
    line = next(s for s in printed.getvalue().splitlines() if s.startswith("utilisation:"))
    said = (f"baseline {found.baseline.share:.1%} -> pick {found.pick.share:.1%} of " if doc.verified
            else f"baseline {found.baseline.share:.1%} of ")
    assert said in line and "the measured cpu fp32 matmul peak on " in line, line
