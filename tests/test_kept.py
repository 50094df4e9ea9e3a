"""A run whose standalone pairs did not clear 1x emits the baseline, keeps the configuration
that was faster by their median (best_config.json's ``kept``), says so plainly, and
`autotune verify OUTDIR` measures that one again."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from autotune import pipeline, schemas
from autotune.cli import main
from autotune.config import TrialConfig
from autotune.document.interval import Interval
from autotune.document.kept import Kept
from autotune.document.run import RunDocument
from autotune.report.console import Reporter
from autotune.report.files import write_report
from autotune.reverify import reverify
from autotune.search.task_space import build_task_space
from autotune.sections import SearchOptions
from autotune.trials.script_report import ScriptReport

from doubles import StandInRunner, recorded_machine, tune_stand_in
from helpers import MODELS, knob_cnn, one_screen, pinned_allocator
from recorded_run import load_doc

KEPT = Kept(config=TrialConfig(nprocs=1, threads=2, batch_size=128), launcher="verify/candidate-0/launch.sh",
            interval=Interval(ratio=1.31, low=0.87, high=1.99, level=0.95), pairs=6, lower_bound=0.93)


def kept_document() -> RunDocument:
    """The recorded run's document as a run that verified nothing and kept ``KEPT``."""
    whole = load_doc()
    return dataclasses.replace(whole, best=None, speedup=None, config=whole.baseline.config, verification={},
                               ablation=None, kept=KEPT)


def test_a_kept_configuration_reads_back_and_conforms_and_a_document_without_it_still_reads():
    written = kept_document().to_json()
    assert written["kept"]["launcher"] == "verify/candidate-0/launch.sh" and written["kept"]["median"] == 1.31
    assert schemas.problem(written, "best_config") is None
    assert RunDocument.from_json(written) == kept_document()
    assert RunDocument.from_json(json.loads(json.dumps(written))).kept == KEPT
    older = {k: v for k, v in written.items() if k != "kept"}
    assert RunDocument.from_json(older).kept is None
    assert schemas.problem(older, "best_config") is None
    no_launcher = {**written, "kept": {k: v for k, v in written["kept"].items() if k != "launcher"}}
    assert "'launcher' is a required property" in schemas.problem(no_launcher, "best_config")


def test_the_summary_and_the_report_say_it_was_faster_by_the_median_and_not_emitted(tmp_path, capsys):
    folder = tmp_path / "my out"
    Reporter().details(kept_document(), folder)
    said = capsys.readouterr().out
    assert "no configuration was verified faster than the baseline." in said
    assert (f"{KEPT.config.short()} was faster by a median of 1.31x over 6 pairs, but a re-run may be slower "
            "on this machine (0.87-1.99x): not emitted; the baseline is recommended. "
            f"`autotune verify {folder}` measures it again (its scripts: {folder}/verify/candidate-0/launch.sh)"
            ) in said
    Reporter().details(dataclasses.replace(kept_document(), kept=None), folder)
    assert "faster by a median" not in capsys.readouterr().out
    folder.mkdir()
    (folder / "best_config.json").write_text(json.dumps(kept_document().to_json()))
    md, page = write_report(folder, study=None)[:2]
    for text in (md.read_text(), page.read_text()):
        assert "faster by a median of 1.31x over 6 pairs" in text and "not emitted" in text
        assert "verify/candidate-0/launch.sh" in text


def straddling_runner(task) -> StandInRunner:
    """Every candidate looks 3x faster than the baseline side by side; run alone, the first
    one tried (candidate-0) is a little slower than the baseline by the median of its pairs,
    the second (candidate-1) faster by their median with pairs either side of 1x."""
    machine = recorded_machine("avx2_epyc")
    baseline = build_task_space(task, machine, SearchOptions.of(pipeline.RunOptions(), task=task)).baseline
    ratios = {"candidate-0": [0.95, 1.03, 0.97, 0.99, 1.02, 0.96],
              "candidate-1": [1.5, 0.8, 1.6, 0.85, 1.45, 1.3]}

    class Straddling(StandInRunner):
        def run_script(self, launcher, **kw):
            side = Path(launcher).parent.name
            if side == "baseline":
                return super().run_script(launcher, **kw)
            self.scripts.append(Path(launcher))
            ran = sum(1 for p in self.scripts if p.parent.name == side)
            return ScriptReport(samples_per_s=ratios[side][(ran - 1) % 6] * self.throughput(baseline))

    return Straddling(machine, served=lambda cfg: 1.0 if cfg == baseline else 3.0)


def test_a_run_whose_pairs_straddle_1x_keeps_the_faster_and_autotune_verify_measures_it(tmp_path, capsys):
    task = knob_cnn()
    doc = tune_stand_in(task, tmp_path, straddling_runner(task))
    out = tmp_path / "out"
    assert not doc["verified"] and doc["config"] == doc["baseline"]["config"]  # `autotune run` exits 3
    assert schemas.problem(doc, "best_config") is None
    kept = doc["kept"]
    # the first tried whose pairs were faster by their median: candidate-0's were not
    assert kept["launcher"] == "verify/candidate-1/launch.sh" and (out / kept["launcher"]).exists()
    written = json.loads((out / "verify" / "candidate-1" / "best_config.json").read_text())
    assert kept["config"] == written["candidate"]
    refused = next(r for r in doc["rejected"] if r["config"] == kept["config"])["checks"]["standalone"]
    assert kept["median"] == refused["median"] > 1.0 and kept["pairs"] == refused["pairs"]
    assert kept["ci_low"] == refused["ci_low"] < 1.0 and kept["ci_high"] == refused["ci_high"]
    Reporter().details(RunDocument.from_json(doc), out)
    said = " ".join(capsys.readouterr().out.split())
    assert (f"faster by a median of {kept['median']:.2f}x over {kept['pairs']} pairs, but a re-run may be slower "
            f"on this machine ({kept['ci_low']:.2f}-{kept['ci_high']:.2f}x): not emitted") in said
    assert f"`autotune verify {out}` measures it again (its scripts: {out}/verify/candidate-1/launch.sh)" in said

    # `autotune verify OUTDIR`: the kept configuration's launch.sh against the baseline's,
    # here steadily faster alone
    runner = StandInRunner(recorded_machine("avx2_epyc"))
    result = reverify(out, options=pipeline.RunOptions(rounds=4, pairs=4, pair_seconds=1.0),
                      reporter=Reporter(), machine=recorded_machine("avx2_epyc"), runner=runner)
    assert result.kept == "verify/candidate-1/launch.sh" and result.verified, result.reason
    assert out / "verify" / "candidate-1" / "launch.sh" in runner.scripts
    assert "measuring the configuration it kept" in capsys.readouterr().err
    assert json.loads((out / "reverify.json").read_text())["kept"] == "verify/candidate-1/launch.sh"
    # without a kept configuration the baseline itself is all there is
    (out / "best_config.json").write_text(json.dumps({k: v for k, v in doc.items() if k != "kept"}))
    again = reverify(out, options=pipeline.RunOptions(rounds=4, pairs=4, pair_seconds=1.0),
                     reporter=Reporter(), machine=recorded_machine("avx2_epyc"), runner=runner)
    assert not again.verified and again.reason == "the configuration is the baseline itself: nothing to verify"


# Everything but the batch size pinned: the search's heuristic trials reach batch 32 within
# three trials, and no other knob lengthens the verification.
LEVEL_FIXES = ("layout=1xdefault", "num_workers=0", "interop_threads=default", "optimizer_step=default",
               "compile=off", f"allocator={pinned_allocator()}", "affinity=none", "precision=fp32")


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_real_run_level_alone_is_not_verified_and_keeps_what_its_pairs_favoured(tmp_path, monkeypatch, capsys):
    """tests/models/level_alone.py: batch 32 is faster in the trials and side by side; its
    script run alone is in turn faster and slower than the baseline's."""
    monkeypatch.setenv("AUTOTUNE_TEST_LEVEL_COUNTER", str(tmp_path / "runs"))
    out = tmp_path / "out"
    code = main(["run", str(MODELS / "level_alone.py"), "--out", str(out), "--trials", "3", "--window", "0.2",
                 "--windows", "2", "--rounds", "4", "--pairs", "2", "--pair-seconds", "0.5", "--no-profile",
                 "--batch-range", "16-32", *(f"--fix={fix}" for fix in LEVEL_FIXES)])
    doc = json.loads((out / "best_config.json").read_text())
    assert code == 3 and not doc["verified"] and doc["config"] == doc["baseline"]["config"]
    assert schemas.problem(doc, "best_config") is None
    printed = capsys.readouterr().out
    said = " ".join(printed.split())
    alone = [(r["config"], s) for r in doc["rejected"] if "ratios" in (s := r["checks"].get("standalone", {}))]
    favoured = [(cfg, s) for cfg, s in alone if s["median"] > 1.0]
    if not favoured:  # by chance the side-by-side rounds or the pairs found it no faster
        assert "kept" not in doc and "faster by a median" not in said
        return
    cfg, figures = favoured[0]
    kept = doc["kept"]
    assert kept["config"] == cfg and kept["median"] == figures["median"] and kept["pairs"] == figures["pairs"]
    assert re.fullmatch(r"verify/candidate-\d+/launch\.sh", kept["launcher"]) and (out / kept["launcher"]).exists()
    answer = one_screen(printed, out)
    assert answer[0] == (f"not verified: keep yours; the fastest ran {kept['median']:.2f}x faster by its median "
                         f"({kept['pairs']} pairs), a re-run {kept['ci_low']:.2f}-{kept['ci_high']:.2f}x")
    assert f"  `autotune verify {out}` measures it again" in answer
    assert main(["show", str(out), "--details"]) == 0  # the whole sentence, its scripts named
    assert (f"faster by a median of {kept['median']:.2f}x over {kept['pairs']} pairs, but a re-run may be slower "
            f"on this machine ({kept['ci_low']:.2f}-{kept['ci_high']:.2f}x): not emitted; the baseline is "
            f"recommended. `autotune verify {out}` measures it again (its scripts: {out / kept['launcher']})") in \
        " ".join(capsys.readouterr().out.split())
