"""The verdict of a gate that judges by evaluate(): a candidate against the training it is
judged against (the quality check: its fp32 twin; the batch check: the user's batch), the
two trained from the same seeds, seed after seed until the verdict is known or the seeds
verification holds are spent.

Pairs, not draws. Two trainings from one seed share their initial weights and their data
order, so a seed that starts badly starts both badly: the difference between the two sees
what the knob changes, not what the seed changes. (Under reduced precision the pair also
shares its trajectory; a larger batch does not, and the difference is still the fair
comparison, with whatever the pair shares taken out.) The test is on those differences.

The test: non-inferiority with a margin. Per seed, the drop is the reference's evaluate()
less the candidate's, the median over the points both were scored at. Over the seeds,
Student's t gives the mean drop's ``LEVEL`` interval. Accepted where its upper end is within
the margin (the candidate is shown to lose no more than it), rejected where its lower end
is beyond it (shown to lose more), otherwise another seed, up to what verification holds;
inconclusive only then. Each end is a one-sided test at 95%; looking after every seed
rather than once makes a wrong verdict a little likelier than that, and the calibration
models measure both error rates as they are (BENCHMARKS.md, ``bench/verdicts.py``).

The margin: the allowance (``--max-quality-drop``, else a share of the reference's metric)
or ``NOISE_SHARE`` times fp32's own standard deviation between seeds, the larger: a change
smaller than half of what the user's training already varies by from seed to seed is not
one the user could tell from a reseed. The spread widens the margin only where fp32
learned more over the training than its seeds differ by (its gain from step 0 past its
standard deviation), so a training too short to learn cannot accept a knob on its noise;
and never for a knob that trades quality by design (pruning: the allowance alone)."""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

from autotune.document.quality import QualityJudgement, QualityVerdict
from autotune.verify.stats import t_quantile

LEVEL = 0.9  # the interval's: each end a one-sided test at 95%
NOISE_SHARE = 0.5
# A standard deviation needs two seeds; most verdicts are settled there (a precision that
# tracks fp32 differs from its twin by far less than the margin). The most: a price.
FEWEST_SEEDS = 2
MOST_SEEDS = 6

Scores = Mapping[int, float]  # evaluate() by samples trained (0: before any step); higher is better
Seed = tuple[Scores, Scores]  # the reference's and the candidate's, from one seed


@dataclasses.dataclass(frozen=True)
class Allowance:
    """What the candidate may lose whatever the noise (``allowed``, said as ``words``),
    whether fp32's spread may widen it (``noise_passes``: not for pruning), and what a
    verdict the seeds did not settle becomes once they are spent (``unsettled``): for a knob
    that trades quality, inconclusive (the candidate must show it loses no more than the
    margin); for a batch, accepted (a drop is a rejection only where it is shown beyond the
    margin: the batch changes no arithmetic, and a larger one that truly learns less at equal
    samples shows it seed after seed)."""

    allowed: float
    words: str
    noise_passes: bool = True
    unsettled: QualityVerdict = QualityVerdict.INCONCLUSIVE


def _points(seeds: Sequence[Seed]) -> tuple[list[dict[int, float]], list[dict[int, float]], tuple[int, ...]]:
    """The references' and candidates' scores at the points all of them were scored at past
    the start; trainings scored at no point in common are compared at their ends."""
    refs = [dict(r) for r, _ in seeds]
    cands = [dict(c) for _, c in seeds]
    common = set(refs[0])
    for scores in (*refs, *cands):
        common &= set(scores)
    points = tuple(sorted(common - {0}))
    if not points:
        last = max(max(s) for s in (*refs, *cands))
        refs = [{**({0: r[0]} if 0 in r else {}), last: r[max(r)]} for r in refs]
        cands = [{last: c[max(c)]} for c in cands]
        points = (last,)
    return refs, cands, points


def judge(seeds: Sequence[Seed], *, allowance: Allowance, samples: int, length: str, final: bool,
          more_s: float | None = None) -> QualityJudgement | None:
    """The verdict on ``seeds`` (at least ``FEWEST_SEEDS``), or None where the seeds do not
    settle it and it is not ``final`` (the seeds verification holds are not spent)."""
    refs, cands, points = _points(seeds)
    drops = [statistics.median(r[p] - c[p] for p in points) for r, c in zip(refs, cands)]
    n = len(drops)
    mean = statistics.fmean(drops)
    half = t_quantile(1 - (1 - LEVEL) / 2, n - 1) * statistics.stdev(drops) / math.sqrt(n) if n > 1 else math.inf
    spread = statistics.median(statistics.stdev(r[p] for r in refs) for p in points) if n > 1 else 0.0
    untrained = statistics.fmean(r[0] for r in refs) if all(0 in r for r in refs) else None
    gain = statistics.fmean(r[points[-1]] for r in refs) - untrained if untrained is not None else None
    widens = allowance.noise_passes and (gain is None or spread < gain)
    margin = max(allowance.allowed, NOISE_SHARE * spread) if widens else allowance.allowed
    low, high = mean - half, mean + half
    if high <= margin:
        verdict = QualityVerdict.ACCEPTED
    elif low > margin:
        verdict = QualityVerdict.REJECTED
    elif final:
        verdict = allowance.unsettled
    else:
        return None
    return QualityJudgement(
        points=points, references=tuple(tuple(r[p] for p in points) for r in refs),
        candidates=tuple(tuple(c[p] for p in points) for c in cands), untrained=untrained, gain=gain,
        drops=tuple(drops), mean_drop=mean, low=low, high=high, level=LEVEL, spread=spread,
        allowed=allowance.allowed, allowance=allowance.words, noise_share=NOISE_SHARE, noise_widens=widens,
        margin=margin, verdict=verdict, samples=samples, length=length, settled=low > margin or high <= margin,
        more_s=more_s if verdict is QualityVerdict.INCONCLUSIVE else None)


def sequential(train: Callable[[int], Seed | str], decide: Callable[[Sequence[Seed], bool, float | None],
                                                                  QualityJudgement | None],
               *, most: int = MOST_SEEDS, affords: Callable[[float], bool] = lambda seconds: True
               ) -> QualityJudgement | str:
    """Seeds 0, 1, ... trained in pairs (``train(seed)``: the pair's scores, or why a training
    failed) and judged (``decide(seeds, final, more_s)``) from ``FEWEST_SEEDS`` on, until a
    verdict or ``most`` seeds, or until ``affords(seconds)`` says another seed, as long as the
    longest so far, is not within the price (``--timeout``'s reserve)."""
    seeds: list[Seed] = []
    spent: list[float] = []
    for seed in range(max(most, FEWEST_SEEDS)):
        if seed >= FEWEST_SEEDS and not affords(max(spent)):
            break
        started = time.monotonic()
        found = train(seed)
        spent.append(time.monotonic() - started)
        if isinstance(found, str):
            return found
        seeds.append(found)
        if len(seeds) >= FEWEST_SEEDS and (verdict := decide(seeds, False, None)) is not None:
            return verdict
    final = decide(seeds, True, max(spent))
    assert final is not None  # a final verdict is always given
    return final
