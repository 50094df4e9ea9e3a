"""The measured parts of a run's document: intervals, a check's figures, the speedup and
its standalone pairs, the candidates' outcomes, the precision note, the baseline and the best."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from autotune.config import KnobValue, TrialConfig
from autotune.document.interval import Interval
from autotune.document.quality import QualityJudgement
from autotune.runtime.json_value import JsonObject, JsonValue

# Where the printed speedup's interval comes from, as best_config.json tells its reader.
STANDALONE_COVERS = ("where a re-measurement of as many pairs of the emitted launch.sh against "
                     "the baseline's script, each run alone on this machine, alternating, is "
                     "expected to land: the run-to-run spread seen while verifying, a drift from "
                     "one session to the next, and any drift or second speed either side showed "
                     "over the pairs")


def optional_fields(**fields: JsonValue) -> JsonObject:
    """The fields that are set: an absent key, not a null, where a part did not happen."""
    return {k: v for k, v in fields.items() if v is not None}


@dataclasses.dataclass(frozen=True)
class Check:
    """One verification check: passed, failed, or None where it does not apply; ``detail``
    holds its figures and, where it failed or did not apply, its ``reason``."""

    passed: bool | None
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def reason(self) -> str | None:
        return self.detail.get("reason")

    def to_json(self) -> JsonObject:
        return {"passed": self.passed, **self.detail}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Check:
        return cls(data["passed"], {k: v for k, v in data.items() if k != "passed"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiedSpeedup:
    """The printed speedup: the standalone pairs' median ratio and where a re-measurement
    of as many pairs lands (``interval``); ``lower_bound`` the figure a re-measurement stays
    above, as often as ``interval.level`` says (one-sided; None in documents from before
    it); ``median_interval`` is the median's own distribution-free interval (what the check
    tests against 1.0); ``side_by_side`` the same two configurations' ratio in the
    verification's side-by-side rounds; ``speed_shift`` names a side that ran at two
    speeds or drifted over the pairs (``autotune.verify.standalone.speed_shift``)."""

    interval: Interval
    pairs: int
    seconds_per_run: float
    wall_s: float
    median_interval: Interval
    side_by_side: Interval
    unsteady: str | None = None  # why the figure may not hold, when the pairs ranged widely
    covers: str = STANDALONE_COVERS
    lower_bound: float | None = None
    speed_shift: str | None = None

    def headline(self) -> JsonObject:
        """The figures a re-verification prints and compares (reverify.json)."""
        return {**self.interval.to_json(), "pairs": self.pairs, **optional_fields(lower_bound=self.lower_bound)}

    def to_json(self) -> JsonObject:
        return {**self.interval.to_json(), **optional_fields(lower_bound=self.lower_bound), "pairs": self.pairs,
                "seconds_per_run": self.seconds_per_run, "wall_s": self.wall_s,
                "covers": self.covers,
                "median_interval": self.median_interval.bounds_json(),
                "side_by_side": self.side_by_side.to_json(),
                **optional_fields(unsteady=self.unsteady, speed_shift=self.speed_shift)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> VerifiedSpeedup:
        return cls(interval=Interval.from_json(data), pairs=data["pairs"],
                   seconds_per_run=data["seconds_per_run"], wall_s=data["wall_s"],
                   median_interval=Interval.around(data["median"], data["median_interval"]),
                   side_by_side=Interval.from_json(data["side_by_side"]),
                   unsteady=data.get("unsteady"), covers=data["covers"],
                   lower_bound=data.get("lower_bound"), speed_shift=data.get("speed_shift"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Standalone:
    """The standalone check's figures: the pairs' rates, both sides, and the speedup."""

    speedup: VerifiedSpeedup
    ratios: tuple[float, ...]
    samples_per_s: tuple[float, ...]
    baseline_samples_per_s: tuple[float, ...]
    median_samples_per_s: float
    baseline_median_samples_per_s: float
    served_over_alone: Mapping[str, float]  # candidate, baseline: side by side over alone
    cap: int | None = None  # the most pairs it would have run (--pairs)
    stopped: str | None = None  # why the pairs ended before the cap
    peak_mb: float | None = None  # the emitted script's busiest rank at its peak, the most of its runs
    overlapped: bool = False  # each run set up while the one before it trained

    def to_json(self) -> JsonObject:
        sp = self.speedup.to_json()
        return {**self.speedup.interval.to_json(), "interval": "rerun",
                **optional_fields(lower_bound=self.speedup.lower_bound),
                "median_interval": sp["median_interval"], "pairs": self.speedup.pairs,
                "ratios": list(self.ratios), "samples_per_s": list(self.samples_per_s),
                "median_samples_per_s": self.median_samples_per_s,
                "baseline_samples_per_s": list(self.baseline_samples_per_s),
                "baseline_median_samples_per_s": self.baseline_median_samples_per_s,
                "seconds_per_run": self.speedup.seconds_per_run, "wall_s": self.speedup.wall_s,
                "side_by_side": sp["side_by_side"], "served_over_alone": dict(self.served_over_alone),
                "covers": self.speedup.covers,
                **optional_fields(unsteady=self.speedup.unsteady, speed_shift=self.speedup.speed_shift,
                                  cap=self.cap, stopped=self.stopped, peak_mb=self.peak_mb),
                **({"overlapped": True} if self.overlapped else {})}

    @classmethod
    def from_check(cls, check: Check | None) -> Standalone | None:
        """The figures of a standalone check; None when it did not run or its script failed."""
        if check is None or "ratios" not in check.detail:
            return None
        d = check.detail
        return cls(speedup=VerifiedSpeedup.from_json(d), ratios=tuple(d["ratios"]),
                   samples_per_s=tuple(d["samples_per_s"]),
                   baseline_samples_per_s=tuple(d["baseline_samples_per_s"]),
                   median_samples_per_s=d["median_samples_per_s"],
                   baseline_median_samples_per_s=d["baseline_median_samples_per_s"],
                   served_over_alone=d["served_over_alone"], cap=d.get("cap"), stopped=d.get("stopped"),
                   peak_mb=d.get("peak_mb"), overlapped=bool(d.get("overlapped")))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rounds:
    """A check's per-round ratios of the emitted configuration over the baseline (side by
    side, or the standalone pairs), the emitted configuration's rate in each, and the
    median and interval the check recorded (None where it recorded none)."""

    ratios: tuple[float, ...]
    samples_per_s: tuple[float, ...]
    baseline_samples_per_s: tuple[float, ...]
    median: float | None
    ci_low: float | None
    ci_high: float | None

    @classmethod
    def from_check(cls, check: Check | None) -> Rounds | None:
        """None where the check did not run or measured no round."""
        if check is None or not check.detail.get("ratios"):
            return None
        d = check.detail
        return cls(ratios=tuple(d["ratios"]), samples_per_s=tuple(d.get("samples_per_s") or ()),
                   baseline_samples_per_s=tuple(d.get("baseline_samples_per_s") or ()),
                   median=d.get("median"), ci_low=d.get("ci_low"), ci_high=d.get("ci_high"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class CandidateOutcome:
    """One candidate of the verification: its side-by-side speed over the baseline (None
    where it was not measured) and what became of it."""

    config: TrialConfig
    speed: Mapping[str, float | None]  # median, ci_low, ci_high, relative_to_candidates
    checks: tuple[str, ...]
    outcome: str

    SPEED_KEYS = ("median", "ci_low", "ci_high", "relative_to_candidates")

    @property
    def median(self) -> float | None:
        return self.speed.get("median")

    @property
    def ci_low(self) -> float | None:
        return self.speed.get("ci_low")

    @property
    def ci_high(self) -> float | None:
        return self.speed.get("ci_high")

    def to_json(self) -> JsonObject:
        return {"config_short": self.config.short(), "config": self.config.to_dict(),
                **{k: self.speed.get(k) for k in self.SPEED_KEYS},
                "checks": list(self.checks), "outcome": self.outcome}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CandidateOutcome:
        return cls(config=TrialConfig.from_dict(data["config"]),
                   speed={k: data.get(k) for k in cls.SPEED_KEYS},
                   checks=tuple(data["checks"]), outcome=data["outcome"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rejection:
    config: TrialConfig
    reason: str
    checks: Mapping[str, Check]

    def to_json(self) -> JsonObject:
        return {"config": self.config.to_dict(), "config_short": self.config.short(),
                "reason": self.reason, "checks": {n: c.to_json() for n, c in self.checks.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Rejection:
        return cls(config=TrialConfig.from_dict(data["config"]), reason=data["reason"],
                   checks={n: Check.from_json(c) for n, c in data["checks"].items()})


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrecisionNote:
    """Which precision was chosen, how it was checked, why others were not, how to opt out.
    ``inconclusive``: the faster precisions whose quality check could not tell, and how to
    accept one; ``judged``: what the quality check found for each configuration it judged,
    by its short name."""

    chosen: str
    rejected: Mapping[str, str]
    instead: str
    skipped: Mapping[str, str]
    checked: str | None = None
    opt_out: str | None = None
    inconclusive: Mapping[str, str] = dataclasses.field(default_factory=dict)
    judged: Mapping[str, QualityJudgement] = dataclasses.field(default_factory=dict)

    def to_json(self) -> JsonObject:
        # inconclusive and judged only where the quality check ran: a document without one
        # reads as an earlier version wrote it
        return {"chosen": self.chosen, **optional_fields(checked=self.checked),
                "rejected": dict(self.rejected),
                **({"inconclusive": dict(self.inconclusive)} if self.inconclusive else {}), "instead": self.instead,
                **optional_fields(opt_out=self.opt_out), "skipped": dict(self.skipped),
                **({"judged": {name: j.to_json() for name, j in self.judged.items()}} if self.judged else {})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PrecisionNote:
        return cls(chosen=data["chosen"], rejected=data["rejected"], instead=data["instead"],
                   skipped=data["skipped"], checked=data.get("checked"), opt_out=data.get("opt_out"),
                   inconclusive=data.get("inconclusive") or {},
                   judged={name: QualityJudgement.from_json(j) for name, j in (data.get("judged") or {}).items()})


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayoutEffect:
    """Several ranks against one process on all cores, every other knob equal."""

    multi_rank: str
    single_process: str
    other_knobs: Mapping[str, KnobValue]
    effect: Interval  # the multi-rank layout's speed over the single process's

    def to_json(self) -> JsonObject:
        return {"multi_rank": self.multi_rank, "single_process": self.single_process,
                "other_knobs": dict(self.other_knobs), **self.effect.to_json(centre="ratio")}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LayoutEffect:
        return cls(multi_rank=data["multi_rank"], single_process=data["single_process"],
                   other_knobs=data["other_knobs"],
                   effect=Interval.from_json(data, centre="ratio"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Baseline:
    config: TrialConfig
    samples_per_s: float
    runs: tuple[float, ...]  # the rates its figure is the median of

    def to_json(self) -> JsonObject:
        return {"config": self.config.to_dict(), "samples_per_s": self.samples_per_s,
                "runs": list(self.runs)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Baseline:
        return cls(config=TrialConfig.from_dict(data["config"]),
                   samples_per_s=data["samples_per_s"], runs=tuple(data["runs"]))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Best:
    """The emitted configuration's rate (from the standalone pairs) and what the search
    measured of its memory and one-time cost; the GPU's peak where it ran on one."""

    samples_per_s: float
    peak_mem_mb: float | None
    one_time_s: float | None
    cuda_peak_mb: float | None = None
    cuda_total_mb: float | None = None

    def to_json(self) -> JsonObject:
        out: JsonObject = {"samples_per_s": self.samples_per_s, "peak_mem_mb": self.peak_mem_mb,
                           "one_time_s": self.one_time_s}
        if self.cuda_peak_mb is not None:  # host memory says nothing of the GPU's
            out.update(cuda_peak_mb=self.cuda_peak_mb, cuda_total_mb=self.cuda_total_mb)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Best:
        return cls(samples_per_s=data["samples_per_s"], peak_mem_mb=data["peak_mem_mb"],
                   one_time_s=data["one_time_s"], cuda_peak_mb=data.get("cuda_peak_mb"),
                   cuda_total_mb=data.get("cuda_total_mb"))


class WritesJson(Protocol):
    def to_json(self) -> JsonObject: ...


def json_list(items: Sequence[WritesJson]) -> list[JsonObject]:
    return [item.to_json() for item in items]
