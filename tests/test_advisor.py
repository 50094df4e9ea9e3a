"""The advice `autotune show` and the report give: from measurements only, in the user's
words ("default", never "None"), tolerant of what a document or study lacks."""
from __future__ import annotations

import dataclasses

import pytest

from autotune.config import TrialConfig
from autotune.document.ablation import Ablation, AblationPath
from autotune.document.interval import Interval
from autotune.document.measures import Rejection
from autotune.document.run import RunDocument
from autotune.report.advice import advise, param_importances, throughput_by_value

from recorded_run import ABLATION, TRIALS, _config, build_study, load_doc


@pytest.fixture
def doc() -> RunDocument:
    return load_doc()


def test_values_pytorch_leaves_to_its_default_read_default_never_none(doc):
    lines = advise(doc)
    text = "\n".join(lines)
    assert "interop_threads default -> 1" in text, text
    assert "layout 1xdefault -> 2x1" in text
    assert "None" not in text
    assert lines[0].startswith("The tuned configuration trains at 2.87x the baseline's speed (1.81-4.73x, 95%)")
    assert doc.speedup.covers in text


def test_each_knob_of_the_ablation_gets_its_worth_and_a_removed_one_says_so(doc):
    doc = dataclasses.replace(doc, ablation=ABLATION)
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
    doc = dataclasses.replace(doc, ablation=dataclasses.replace(ABLATION, product=4.1))
    lines = [line.strip() for line in advise(doc)]
    assert ("the leave-one-out ratios above multiply to 4.10x instead: the knobs complement each "
            "other: each removal costs more than its share") in lines
    path = dataclasses.replace(ABLATION.path, total=Interval(ratio=2.2, low=2.1, high=2.3, level=0.95))
    doc = dataclasses.replace(doc, ablation=dataclasses.replace(ABLATION, path=path))
    lines = [line.strip() for line in advise(doc)]
    assert any(line.endswith("the speed check measured it at 2.79x (2.48-4.94): the intervals do not overlap "
                             "(the machine's speed changed between the two?)") for line in lines), lines
    interval = dataclasses.replace(doc.speedup.interval, low=3.0, high=3.5, ratio=3.2)
    doc = dataclasses.replace(doc, speedup=dataclasses.replace(doc.speedup, interval=interval))
    assert any(line.endswith(": outside (on this machine the speedup measured side by side is 0.87x the one "
                             "measured alone, and the steps are measured side by side)")
               for line in (line.strip() for line in advise(doc))), advise(doc)
    skipped = AblationPath(skipped="the baseline could not be measured beside the winner: crash")
    doc = dataclasses.replace(doc, ablation=dataclasses.replace(ABLATION, path=skipped))
    assert any("the path from the baseline was not measured: the baseline could not" in line
               for line in advise(doc))


def test_a_document_without_an_ablation_or_with_a_skipped_one_is_advised_too(doc):
    assert not any("winner's speed" in line for line in advise(doc))
    doc = dataclasses.replace(doc, ablation=Ablation(
        skipped="the winner could not be held for the ablation: OOM"))
    assert any("not measured: the winner could not be held" in line for line in advise(doc))
    advise(dataclasses.replace(doc, ablation=Ablation()))


def test_what_was_not_searched_is_listed_with_its_reason_and_what_other_hardware_would_add(doc):
    doc = dataclasses.replace(doc, space=dataclasses.replace(doc.space, excluded={
        **doc.excluded,
        "precision=bf16": "CPU has no avx512_bf16/AMX: bf16 autocast would be emulated and about 2x slower",
        "allocator=jemalloc": "libjemalloc was not found on this machine",
        "compile": "torch.compile needs a working C++ compiler: none found",
        "precision=bf16,tf32": "--exact keeps fp32",
    }))
    lines = advise(doc)
    text = "\n".join(lines)
    for knob, reason in doc.excluded.items():
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
    rejected = Rejection(config=TrialConfig.from_dict(_config(doc, layout="1x2", batch_size=512)),
                         reason="numerics: losses drifted 14%", checks={})
    assert rejected.config.short() == "layout=1x2 batch=512"
    doc = dataclasses.replace(doc, best=None, speedup=None, rejected=(rejected,))
    assert not doc.verified
    lines = advise(doc)
    assert lines[0].startswith("No configuration was verified faster than the baseline (3,706 samples/s)")
    assert "  rejected layout=1x2 batch=512: numerics: losses drifted 14%" in lines
