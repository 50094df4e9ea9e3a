"""The whole run (space, search, candidate choice, verification, emitted files) on
recorded probes of machines this suite may not run on: an AVX2-only CPU, an AMX
Sapphire Rapids, one H100, eight H100s. A stand-in runner measures: throughput is a
function of the configuration and the machine, losses and evaluate() follow the
precision, and a flag makes reduced precision diverge.

Each machine asserts which knobs exist, that a reduced-precision winner whose numerics
pass is emitted, that the fastest exact configuration is emitted when they fail, and
that nothing is rejected for a gate the user did not ask for.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune import pipeline
from autotune.config import TrialConfig
from autotune.document.run import RunDocument
from autotune.report.console import Reporter
from autotune.search.task_space import build_task_space
from autotune.sections import SearchOptions
from autotune.trials.runner import TrialResult

from doubles import StandInRunner, recorded_machine
from helpers import knob_cnn, written_document

MACHINES = ("avx2_epyc", "amx_spr", "h100x1", "h100x8")


@pytest.fixture(autouse=True)
def _all_gpus_visible(monkeypatch):
    """The recorded machines' GPUs, whatever this machine's CUDA_VISIBLE_DEVICES says."""
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.fixture(scope="module")
def task():
    return knob_cnn()


def tune(task, name: str, tmp_path: Path, *, diverge: bool = False, **options):
    doc_in = recorded_machine(name)
    runner = StandInRunner(doc_in, diverge=diverge)
    out = tmp_path / name
    out.mkdir()
    pipeline.execute(task, out, pipeline.RunOptions(trials=12, **options), machine=doc_in,
                     runner=runner, reporter=Reporter(quiet=True))
    return written_document(out), runner


def _rejections(doc: dict) -> list[str]:
    return [item["reason"] for item in doc["rejected"]]


EXPECTED_PRECISIONS = {"avx2_epyc": ["fp32"], "amx_spr": ["fp32", "bf16"],
                       "h100x1": ["fp32", "fp16", "bf16", "tf32"],
                       "h100x8": ["fp32", "fp16", "bf16", "tf32"]}


@pytest.mark.parametrize("name", MACHINES)
def test_each_machine_offers_its_own_knobs(task, name):
    doc = recorded_machine(name)
    space = build_task_space(task, doc, SearchOptions.of(pipeline.RunOptions(), task=task))
    assert space.choices["precision"] == EXPECTED_PRECISIONS[name]
    gpus = len(doc["gpus"])
    if gpus:
        assert space.baseline.device == "cuda" and space.choices["backend"] == ["nccl"]
        ranks = {int(s.split("x")[0]) for s in space.choices["layout"]}
        # rank counts that split some batch size evenly, up to every GPU
        splits = {n for n in range(1, gpus + 1)
                  if any(b % n == 0 for b in space.choices["batch_size"])}
        assert ranks == splits and max(ranks) == gpus
        assert "reduce-overhead" in space.choices["compile"] and "pin_memory" in space.choices
    else:
        assert space.baseline.device == "cpu" and "pin_memory" in space.excluded
        assert set(space.choices["allocator"]) == {"default", "jemalloc", "tcmalloc"}
    if name == "avx2_epyc":
        assert "avx512_bf16" in space.excluded["precision=bf16"]
    exact = build_task_space(task, doc, SearchOptions.of(pipeline.RunOptions(exact=True), task=task))
    assert exact.choices["precision"] == ["fp32"]
    assert "prune_ratio" not in exact.choices


@pytest.mark.parametrize("name", MACHINES)
def test_reduced_precision_whose_numerics_pass_is_emitted(task, name, tmp_path):
    doc, runner = tune(task, name, tmp_path)
    assert doc["verified"], _rejections(doc)
    chosen = TrialConfig.from_dict(doc["config"])
    if name == "avx2_epyc":
        assert chosen.precision == "fp32"
    else:
        fastest = "bf16" if name == "amx_spr" else "fp16"
        assert chosen.precision == fastest, doc["candidates"]
        assert doc["precision"]["checked"].startswith(("bf16 autocast", "fp16 autocast"))
        # on CPU one process; on GPUs the candidate's own ranks (one may not hold the batch)
        where = "one-process" if chosen.device == "cpu" or chosen.nprocs == 1 else f"{chosen.nprocs}-rank"
        assert f"tracked the fp32 {where} reference" in doc["precision"]["checked"]
        assert "evaluate() 0.9 vs 0.9" in doc["precision"]["checked"]
        assert "--exact" in doc["precision"]["opt_out"]
        # every precision the machine offers was measured early (after the batch range's
        # measurements), at two batch sizes; on GPUs at the batch range's fastest alone, once
        # it ran faster than the user's: the user's batch leaves the device idle
        ramped = len(doc["batch"]["ramp"]["rates"])
        early = runner.measured[ramped:ramped + 12]
        for p in EXPECTED_PRECISIONS[name][1:]:
            sizes = {c.batch_size for c in early if c.precision == p}
            if chosen.device == "cuda":
                assert sizes and task.batch_size not in sizes, (p, sizes)
            else:
                assert len(sizes) >= 2, p
    # nothing rejected for a gate the user did not ask for
    for reason in _rejections(doc):
        assert "--max-quality-drop" not in reason and "evaluate(model)" not in reason, reason
    written = json.loads((tmp_path / name / "best_config.json").read_text())
    assert written["config"] == doc["config"] and written["precision"] == doc["precision"]
    assert (tmp_path / name / "train_tuned.py").exists() and runner.scripts


@pytest.mark.parametrize("name", ["amx_spr", "h100x1", "h100x8"])
def test_diverging_reduced_precision_falls_back_to_the_fastest_exact_config(task, name, tmp_path):
    doc, runner = tune(task, name, tmp_path, diverge=True)
    assert doc["verified"], "the exact fallback must be verified, not the baseline emitted"
    chosen = TrialConfig.from_dict(doc["config"])
    assert chosen.exact and chosen != TrialConfig.from_dict(doc["baseline"]["config"])
    # the emitted one is the fastest exact configuration the search measured
    exact_values = [runner.throughput(c) for c in runner.measured if c.exact]
    assert runner.throughput(chosen) >= 0.95 * max(exact_values)
    rejected = doc["precision"]["rejected"]
    assert rejected and all("diverge" in reason for reason in rejected.values()), rejected
    # rejected by the gates before any speed measurement: none was held side by side
    reduced_verdicts = [c for c in doc["candidates"] if not TrialConfig.from_dict(c["config"]).exact]
    assert reduced_verdicts and all(c["checks"] == ["numerics"] for c in reduced_verdicts)
    # each rejected one was replaced by the next of its kind, within the budget
    gated_reduced = [c for c in runner.gated if not c.exact]
    assert len(set(gated_reduced)) >= 2


def test_the_summary_says_why_bf16_was_rejected(task, tmp_path, capsys):
    doc, _ = tune(task, "amx_spr", tmp_path, diverge=True)
    Reporter().details(RunDocument.from_json(doc), tmp_path / "amx_spr")
    text = capsys.readouterr().out
    assert "precision: bf16 rejected" in text and "diverge" in text
    assert "fp32" in text


def test_exact_keeps_fp32_on_a_machine_with_bf16(task, tmp_path):
    doc, runner = tune(task, "amx_spr", tmp_path, exact=True)
    assert doc["verified"] and doc["config"]["precision"] == "fp32"
    assert all(c.exact for c in runner.measured)
    assert doc["precision"]["opt_out"].startswith("--exact")


def test_exact_and_a_pinned_reduced_precision_contradict_each_other():
    from autotune.errors import UsageError

    with pytest.raises(UsageError, match="--exact keeps precision=fp32"):
        pipeline.RunOptions(exact=True, fixed={"precision": "bf16"})
    pipeline.RunOptions(exact=True, fixed={"precision": "fp32"})  # the same thing twice is fine


def test_a_users_rank_variables_are_named_in_a_notice(task, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "8")
    monkeypatch.setenv("MASTER_ADDR", "192.0.2.1")
    out = tmp_path / "out"
    out.mkdir()
    pipeline.execute(task, out, pipeline.RunOptions(trials=3), machine=recorded_machine("avx2_epyc"),
                     runner=StandInRunner(recorded_machine("avx2_epyc")), reporter=Reporter())
    err = capsys.readouterr().err.replace("\n", " ")
    assert "MASTER_ADDR, WORLD_SIZE from your environment are not passed to trials" in err


class _BaselineDiesWhenServed(StandInRunner):
    def start(self, cfg, *, name, mode=None, **kw):
        serving = super().start(cfg, name=name, mode=mode)
        if name in ("verify-held-0", "verify-speed-0"):  # the baseline, started ahead or not
            serving.wait_ready = lambda: False
            serving.result = TrialResult(status="failed", failure="crash", message="killed by SIGKILL")
        return serving


def test_a_baseline_that_fails_in_verification_ends_the_run_with_a_message(task, tmp_path):
    from autotune.errors import NotVerified

    doc_in = recorded_machine("avx2_epyc")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(NotVerified, match="baseline failed while verification re-measured it") as err:
        pipeline.execute(task, out, pipeline.RunOptions(trials=4), machine=doc_in,
                         runner=_BaselineDiesWhenServed(doc_in), reporter=Reporter(quiet=True))
    assert "killed by SIGKILL" in str(err.value) and err.value.exit_code == 3
    assert "verify-held-0" in str(err.value), "the log named is the baseline's"


@pytest.mark.parametrize(("visible", "ranks", "device"), [
    (None, 8, "cuda"), ("2,3", 2, "cuda"), ("GPU-aed09b82", 1, "cuda"), ("", 0, "cpu"),
    ("1,7,-1,2", 2, "cuda"),  # CUDA stops reading at the first entry that names no GPU
])
def test_cuda_visible_devices_narrows_the_gpus(task, monkeypatch, visible, ranks, device):
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    space = build_task_space(task, recorded_machine("h100x8"), SearchOptions.of(pipeline.RunOptions(), task=task))
    assert space.baseline.device == device
    if device == "cuda":
        assert max(int(s.split("x")[0]) for s in space.choices["layout"]) == ranks
    if visible is not None:
        assert any("CUDA_VISIBLE_DEVICES" in reason for reason in space.excluded.values())


def test_a_pinned_multi_rank_layout_runs_from_the_cli_spelling(task, tmp_path):
    """--fix layout=2x1 leaves no one-process layout in the space: the baseline is
    measured all the same, and only 2x1 configurations are searched."""
    from autotune.options import parse_fixes

    doc, runner = tune(task, "avx2_epyc", tmp_path, fixed=parse_fixes(["layout=2x1"]))
    assert doc["verified"] and TrialConfig.from_dict(doc["config"]).layout == "2x1"
    assert {c.layout for c in runner.measured} <= {"2x1", "1xdefault"}
