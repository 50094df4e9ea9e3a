"""The advice `autotune show` and the report give: from measurements only, in the user's
words ("default", never "None"), tolerant of what a document or study lacks."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import optuna
import pytest
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from autotune.report.advice import advise, param_importances, throughput_by_value
from autotune.search.study import study_name

FIXTURE = Path(__file__).parent / "fixtures" / "report" / "best_config.json"

# The ablation as the pipeline records it (autotune.verify.ablation.measure), for the winner of
# the fixture run.
ABLATION = {
    "knobs": [
        {"knob": "layout", "baseline": "1xdefault", "winner": "2x1", "ratio": 1.12, "ci_low": 1.05,
         "ci_high": 1.2, "ci_level": 0.9, "kept": True, "note": ""},
        {"knob": "batch_size", "baseline": 64, "winner": 512, "ratio": 1.41, "ci_low": 1.33,
         "ci_high": 1.48, "ci_level": 0.9, "kept": True, "note": ""},
        {"knob": "interop_threads", "baseline": None, "winner": 1, "ratio": 1.08, "ci_low": 1.02,
         "ci_high": 1.15, "ci_level": 0.9, "kept": True, "note": ""},
        {"knob": "precision", "baseline": "fp32", "winner": "bf16", "ratio": 1.7, "ci_low": 1.55,
         "ci_high": 1.86, "ci_level": 0.9, "kept": True, "note": ""},
        {"knob": "channels_last", "baseline": False, "winner": True, "ratio": 1.01, "ci_low": 0.97,
         "ci_high": 1.06, "ci_level": 0.9, "kept": False,
         "note": "no measurable effect: removed from the emitted configuration"},
        {"knob": "allocator", "baseline": "default", "winner": "tcmalloc", "kept": True,
         "note": "could not be measured without it: crash"},
    ],
    "rounds": 8,
    "product": 2.6,
    "path": {
        "steps": [
            {"knobs": [k], "baseline": [b], "winner": [w], "ratio": r, "ci_low": r - 0.05, "ci_high": r + 0.06,
             "ci_level": 0.95, "rounds": 8, "kept": k != "channels_last"}
            for k, b, w, r in (("layout", "1xdefault", "2x1", 1.12), ("batch_size", 64, 512, 1.3),
                               ("interop_threads", None, 1, 1.05), ("precision", "fp32", "bf16", 1.6),
                               ("channels_last", False, True, 0.99), ("allocator", "default", "tcmalloc", 1.02))],
        "total": 2.42, "ci_low": 2.3, "ci_high": 2.55, "ci_level": 0.95, "rounds": 8,
        "kept_product": 2.45,
    },
}


def load_doc() -> dict:
    """A trimmed real result document (fashion_cnn on a 2-core AVX-512 BF16 machine)."""
    return json.loads(FIXTURE.read_text())


def _config(doc: dict, **changes) -> dict:
    """The baseline's configuration with ``changes`` (layout="1x2" sets ranks and threads)."""
    cfg = copy.deepcopy(doc["baseline"]["config"])
    if "layout" in changes:
        ranks, threads = changes.pop("layout").split("x")
        cfg.update(nprocs=int(ranks), threads=int(threads))
    cfg.update(changes, persistent_workers=changes.get("num_workers", cfg["num_workers"]) > 0)
    return cfg


# number: (state, samples/s, role, changes from the baseline, extra user attrs)
TRIALS = [
    (TrialState.COMPLETE, 4388.0, "baseline", {}, {}),
    (TrialState.COMPLETE, 4728.0, "heuristic", {"layout": "1x2", "allocator": "tcmalloc", "affinity": "compact"}, {}),
    (TrialState.COMPLETE, 5583.0, "precision", {"layout": "1x2", "precision": "bf16", "allocator": "tcmalloc"}, {}),
    (TrialState.COMPLETE, 11601.0, None, {"layout": "1x2", "batch_size": 512, "num_workers": 1, "interop_threads": 1,
                                          "precision": "bf16", "channels_last": True, "allocator": "tcmalloc"}, {}),
    (TrialState.COMPLETE, 11464.0, "batch", {"layout": "1x2", "batch_size": 256, "num_workers": 1,
                                             "interop_threads": 1, "precision": "bf16", "channels_last": True}, {}),
    (TrialState.PRUNED, 2422.0, "batch", {"layout": "1x2", "batch_size": 128}, {}),
    (TrialState.FAIL, None, None, {"layout": "2x1", "batch_size": 512, "num_workers": 2},
     {"failure": "out_of_memory", "result": {"message": "RuntimeError: out of memory"}}),
    (TrialState.COMPLETE, 11601.0, None, {"layout": "1x2", "batch_size": 512, "num_workers": 1, "interop_threads": 1,
                                          "precision": "bf16", "channels_last": True, "allocator": "tcmalloc"},
     {"duplicate_of": 3}),
    (TrialState.PRUNED, 4582.0, "late", {"layout": "1x2", "batch_size": 512, "num_workers": 1, "interop_threads": 1,
                                         "compile": "default", "precision": "bf16", "channels_last": True,
                                         "allocator": "tcmalloc"}, {}),
]


def build_study(folder: Path, doc: dict, trials: list | None = None) -> optuna.Study:
    """A journal study in ``folder`` named as `autotune run` names it, holding ``trials``
    with the user attributes the tuner stores (config, role, result, failure)."""
    space = doc["space"]["included"]
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(folder / "study.journal")))
    study = optuna.create_study(storage=storage, direction="maximize",
                                study_name=study_name(Path(doc["model_file"]), doc["fingerprint"]["id"]))
    for state, value, role, changes, extra in TRIALS if trials is None else trials:
        cfg = _config(doc, **changes)
        params = {} if role == "baseline" else {
            k: (f"{cfg['nprocs']}x{cfg['threads']}" if k == "layout" else cfg[k])
            for k in space if len(space[k]) > 1 and (k != "compile" or role == "late")}
        attrs = {"config": cfg, **({"role": role} if role else {}), **extra}
        if state != TrialState.FAIL:
            attrs.setdefault("result", {"status": "ok", "value": value, "message": ""})
        study.add_trial(create_trial(
            state=state, value=value if state == TrialState.COMPLETE else None, params=params,
            distributions={k: CategoricalDistribution(space[k]) for k in params}, user_attrs=attrs,
            intermediate_values={0: value, 1: value} if value is not None else {}))
    return study


@pytest.fixture
def doc() -> dict:
    return load_doc()


def test_values_pytorch_leaves_to_its_default_read_default_never_none(doc):
    lines = advise(doc)
    text = "\n".join(lines)
    assert "interop_threads default -> 1" in text, text
    assert "layout 1xdefault -> 2x1" in text
    assert "None" not in text
    assert lines[0].startswith("The tuned configuration trains at 2.87x the baseline's speed (1.81-4.73x, 95%)")
    assert doc["speedup"]["covers"] in text


def test_each_knob_of_the_ablation_gets_its_worth_and_a_removed_one_says_so(doc):
    doc["ablation"] = ABLATION
    lines = [line.strip() for line in advise(doc)]
    assert "batch_size 64 -> 512: 1.41x (1.33-1.48) of the winner's speed" in lines
    assert "interop_threads default -> 1: 1.08x (1.02-1.15) of the winner's speed" in lines
    assert ("channels_last off -> on: no measurable effect (1.01x, 0.97-1.06): removed from the emitted "
            "configuration" in lines), lines
    assert any(line.startswith("allocator default -> tcmalloc: could not be measured") for line in lines)
    assert "+ batch_size 64 -> 512: 1.30x (1.25-1.36)" in lines
    assert "+ interop_threads default -> 1: 1.05x (1.00-1.11)" in lines
    assert "+ channels_last off -> on: 0.99x (0.94-1.05) (removed from the emitted configuration)" in lines
    assert ("= 2.42x (2.30-2.55), the winner over the baseline side by side; the speed check measured "
            "it at 2.79x (2.48-4.94): consistent, the intervals overlap") in lines
    assert ("the kept knobs' steps multiply to 2.45x; the emitted configuration's script run alone "
            "against the baseline's: 2.87x (1.81-4.73): inside") in lines
    assert not any("leave-one-out" in line for line in lines)  # 2.60 is within 10% of 2.42
    assert "None" not in "\n".join(lines)


def test_when_single_effects_do_not_multiply_to_the_whole_the_advice_says_why(doc):
    doc["ablation"] = {**ABLATION, "product": 4.1}
    lines = [line.strip() for line in advise(doc)]
    assert ("the leave-one-out ratios above multiply to 4.10x instead: the knobs complement each "
            "other: each removal costs more than its share") in lines
    doc["ablation"] = {**ABLATION, "path": {**ABLATION["path"], "total": 2.2, "ci_low": 2.1, "ci_high": 2.3}}
    lines = [line.strip() for line in advise(doc)]
    assert any(line.endswith("the speed check measured it at 2.79x (2.48-4.94): the intervals do not overlap "
                             "(the machine's speed changed between the two?)") for line in lines), lines
    doc["speedup"] = {**doc["speedup"], "ci_low": 3.0, "ci_high": 3.5, "median": 3.2}
    assert any(line.endswith(": outside (on this machine the speedup measured side by side is 0.87x the one "
                             "measured alone, and the steps are measured side by side)")
               for line in (line.strip() for line in advise(doc))), advise(doc)
    doc["ablation"] = {**ABLATION, "path": {"skipped": "the baseline could not be measured beside "
                                                       "the winner: crash"}}
    assert any("the path from the baseline was not measured: the baseline could not" in line
               for line in advise(doc))


def test_a_document_without_an_ablation_or_with_a_skipped_one_is_advised_too(doc):
    assert not any("winner's speed" in line for line in advise(doc))
    doc["ablation"] = {"knobs": [], "skipped": "the winner could not be held for the ablation: OOM"}
    assert any("not measured: the winner could not be held" in line for line in advise(doc))
    doc["ablation"] = {"knobs": []}
    advise(doc)


def test_what_was_not_searched_is_listed_with_its_reason_and_what_other_hardware_would_add(doc):
    doc["space"]["excluded"].update({
        "precision=bf16": "CPU has no avx512_bf16/AMX: bf16 autocast would be emulated and about 2x slower",
        "allocator=jemalloc": "libjemalloc was not found on this machine",
        "compile": "torch.compile needs a working C++ compiler: none found",
        "precision=bf16,tf32": "--exact keeps fp32",
    })
    lines = advise(doc)
    text = "\n".join(lines)
    for knob, reason in doc["space"]["excluded"].items():
        assert f"{knob}: {reason}" in text
    assert "on a CPU with AMX or avx512_bf16" in text
    assert "libjemalloc2" in text and "C++ compiler (e.g. apt-get install g++)" in text
    assert text.count("on an NVIDIA GPU") == 1, text  # device, fp16 and tf32 give one hint
    assert "Ampere or later GPU (A100" not in text  # --exact is a choice, not a limit of the machine
    assert not any("Not searched" in line for line in advise(doc, in_summary=True))


def test_the_search_says_which_value_of_each_knob_won_and_what_was_lost(tmp_path, doc):
    study = build_study(tmp_path, doc)
    text = "\n".join(advise(doc, study=study))
    assert ("The search ran 9 trials: 5 measured to the end, 2 stopped early as clearly slower, 1 failed, "
            "1 repeated an earlier configuration (not measured again).") in text
    # the duplicate of trial 3 counts once: two batch sizes above 256 would read (2 trials)
    assert "batch_size: best 512 at 11,601 (1 trial)" in text, text
    assert "stopped early or failed: 128" in text
    assert "not tried in the search: 16, 32" in text
    assert "compile: only off completed" in text and "stopped early or failed: default" in text
    assert "interop_threads: best 1" in text and "default 0.4" in text
    assert "how much each knob mattered" in text
    assert "None" not in text


def test_throughput_per_value_follows_the_space_order_and_skips_duplicates(tmp_path, doc):
    by_value = throughput_by_value(build_study(tmp_path, doc), doc)
    assert list(by_value["batch_size"]) == [64, 256, 512]
    assert by_value["batch_size"][512] == [11601.0]
    assert "compile" not in by_value  # one value completed: nothing to compare


def test_importances_need_two_completed_trials_that_differ(tmp_path, doc):
    one = build_study(tmp_path, doc, TRIALS[:2])
    assert param_importances(one) == {}
    assert not any("mattered" in line for line in advise(doc, study=one))
    (tmp_path / "b").mkdir()
    same = build_study(tmp_path / "b", doc, [TRIALS[1], TRIALS[1]])
    assert param_importances(same) == {}


def test_when_nothing_was_verified_the_baseline_is_recommended_with_the_rejections(doc):
    doc.update(verified=False, best=None, speedup={"median": 1.0, "ci_low": 1.0, "ci_high": 1.0, "pairs": 0},
               rejected=[{"config_short": "layout=1x2 batch=512", "reason": "numerics: losses drifted 14%"}])
    lines = advise(doc)
    assert lines[0].startswith("No configuration was verified faster than the baseline (3,706 samples/s)")
    assert "  rejected layout=1x2 batch=512: numerics: losses drifted 14%" in lines
