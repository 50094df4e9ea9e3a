"""Which configurations verification re-measures (autotune/pipeline.py)."""
from __future__ import annotations

from autotune.config import TrialConfig
from autotune.pipeline import choose_candidates
from autotune.probes import as_machine
from autotune.space import build_space

MACHINE = as_machine({"cpu": {"usable_cores": 2, "usable_cpus": [0, 1], "isa": {}},
                      "backends": {"gloo": True}, "gpus": []})
SPACE = build_space(MACHINE, baseline_batch=32)


def one(batch: int, **knobs) -> TrialConfig:
    return TrialConfig(nprocs=1, threads=2, batch_size=batch, **knobs)


def ranks(batch: int, **knobs) -> TrialConfig:
    return TrialConfig(nprocs=2, threads=1, batch_size=batch, **knobs)


def test_top_ones_then_the_layout_contrast_of_the_first():
    ranked = [one(32, allocator="tcmalloc"), ranks(64), one(16)]
    got = choose_candidates(ranked, top=2, space=SPACE, machine=MACHINE)
    # Both kinds are among the top two already: only the contrast is added.
    assert got == [ranked[0], ranked[1], ranks(32, allocator="tcmalloc")]


def test_best_of_the_other_layout_joins_when_the_top_ones_are_all_one_kind():
    """tiny_lm in BENCHMARKS.md: the search ranked 1x2 configurations first by a few
    percent of noise; 2 ranks at a larger batch was faster when measured side by side."""
    ranked = [one(32, allocator="tcmalloc"), one(32), one(64), ranks(128, num_workers=1), ranks(16)]
    got = choose_candidates(ranked, top=2, space=SPACE, machine=MACHINE)
    assert got == [ranked[0], ranked[1], ranks(32, allocator="tcmalloc"), ranks(128, num_workers=1)]


def test_nothing_is_added_twice_or_where_there_is_no_other_kind():
    ranked = [one(32, allocator="tcmalloc"), ranks(32, allocator="tcmalloc"), one(64)]
    assert choose_candidates(ranked, top=1, space=SPACE, machine=MACHINE) == ranked[:2]
    single = build_space(MACHINE, baseline_batch=32, batchnorm_layers=("bn",))
    ranked = [one(32), one(64)]
    assert choose_candidates(ranked, top=1, space=single, machine=MACHINE) == [one(32)]
    assert choose_candidates([], top=2, space=SPACE, machine=MACHINE) == []
