"""Which configurations verification re-measures (autotune/verify/candidates.py)."""
from __future__ import annotations

from autotune.config import TrialConfig
from autotune.probes import as_machine
from autotune.search.outcome import Candidate
from autotune.search.trial_summary import TrialSummary
from autotune.space import build_space
from autotune.verify.candidates import batch_rival, choose_candidates

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


def _ranked(*rows) -> list[Candidate]:
    """(config, search value, spread between windows as a share of it), best first."""
    return [Candidate(number=i, config=cfg, value=value, result=TrialSummary(value=value, iqr=value * spread))
            for i, (cfg, value, spread) in enumerate(rows)]


def test_a_batch_size_within_noise_of_the_best_is_verified_beside_it():
    """cifar_cnn in BENCHMARKS.md: one process only (BatchNorm), all fp32; the search
    measured batch 256 at 1,430 and 512 at 1,396 samples/s (each with an 8% spread), and
    verification took batch 256 alone; a grid measured right after ran 512 1.16x faster."""
    best, rival = one(256, channels_last=True), one(512, channels_last=True)
    ranked = _ranked((best, 1430.0, 0.08), (rival, 1396.0, 0.08), (one(128), 1096.0, 0.2))
    assert batch_rival(ranked) == rival
    single = build_space(MACHINE, baseline_batch=64, batchnorm_layers=("bn",))
    got = choose_candidates([c.config for c in ranked], top=1, space=single, machine=MACHINE,
                            rival=batch_rival(ranked))
    assert got == [best, rival]


def test_no_rival_when_the_other_batch_is_clearly_slower_or_of_the_other_precision_kind():
    assert batch_rival(_ranked((one(256), 1430.0, 0.02), (one(512), 1200.0, 0.02))) is None
    # the same batch at other knobs is not a rival: the batch is what is in doubt
    assert batch_rival(_ranked((one(256), 1430.0, 0.02), (one(256, num_workers=1), 1420.0, 0.02))) is None
    assert batch_rival(_ranked((one(256), 1430.0, 0.02), (one(512, precision="bf16"), 1425.0, 0.02))) is None
    # within the 5% floor even where the trials' spreads are smaller
    assert batch_rival(_ranked((one(256), 1430.0, 0.0), (one(512), 1370.0, 0.0))) == one(512)
    assert batch_rival([]) is None


def test_the_layout_line_is_read_from_a_rejected_candidate_measured_beside_its_other_layout():
    """The winner's other layout was not measured, and the only pair measured side by side
    failed a later check (its quality, say): what the layout is worth is still read from it."""
    from autotune.document.interval import Interval
    from autotune.document.measures import Check
    from autotune.verify.layout import run_layout_effect
    from autotune.verify.speed import CandidateSpeed
    from autotune.verify.verdict import Verdict

    def measured(cfg: TrialConfig, rates: tuple[float, ...], passed: bool) -> Verdict:
        speed = CandidateSpeed(interval=Interval(ratio=1.0, low=1.0, high=1.0, level=0.9), ratios=(1.0,) * len(rates),
                               samples_per_s=rates, median_samples_per_s=sorted(rates)[len(rates) // 2])
        return Verdict(cfg, {"quality": Check(passed, {} if passed else {"reason": "its quality"})}, speed=speed)

    winner = measured(one(32, allocator="tcmalloc"), (300.0,) * 5, True)
    split = measured(ranks(64), (100.0, 101.0, 99.0, 100.0, 102.0), False)
    whole = measured(one(64), (200.0, 199.0, 201.0, 200.0, 198.0), False)
    effect = run_layout_effect(winner, [winner, split, whole], [winner.config], SPACE, MACHINE)
    assert effect is not None and (effect.multi_rank, effect.single_process) == ("2x1", "1x2")
    assert 0.45 < effect.effect.ratio < 0.55
    assert run_layout_effect(winner, [winner], [winner.config], SPACE, MACHINE) is None
