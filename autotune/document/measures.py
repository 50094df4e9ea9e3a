"""The measured parts of a run's document: intervals, a check's figures, the speedup and
its standalone pairs, the candidates' outcomes, the precision note, the baseline and the best."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar

from pydantic import WithJsonSchema, computed_field, field_serializer, model_validator
from pydantic.json_schema import JsonSchemaValue

from autotune.config import KnobValue, TrialConfig
from autotune.document.interval import BOUNDS_SCHEMA, Centre, Inline, Interval
from autotune.document.quality import QualityJudgement
from autotune.runtime.json_value import JsonObject, JsonValue
from autotune.schemas.typed import Flattened, HandWritten, Omitted, OmittedEmpty, Record

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
class Check(HandWritten):
    """One verification check: passed, failed, or None where it does not apply; ``detail``
    holds its figures and, where it failed or did not apply, its ``reason``."""

    passed: bool | None
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    # each check writes its own figures beside these
    JSON_SCHEMA: ClassVar[JsonSchemaValue] = {
        "type": "object", "required": ["passed"],
        "properties": {"passed": {"type": ["boolean", "null"]}, "reason": {"type": "string"}}}

    @property
    def reason(self) -> str | None:
        return self.detail.get("reason")

    def to_json(self) -> JsonObject:
        return {"passed": self.passed, **self.detail}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Check:
        return cls(data["passed"], {k: v for k, v in data.items() if k != "passed"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class VerifiedSpeedup(Inline, Record):
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
    median_interval: Annotated[Interval, WithJsonSchema(BOUNDS_SCHEMA, mode="serialization")]
    side_by_side: Interval
    unsteady: Omitted[str] = None  # why the figure may not hold, when the pairs ranged widely
    covers: str = STANDALONE_COVERS
    lower_bound: Omitted[float] = None
    speed_shift: Omitted[str] = None

    INTERVAL: ClassVar[str] = "interval"
    CENTRE: ClassVar[Centre] = "median"

    def headline(self) -> JsonObject:
        """The figures a re-verification prints and compares (reverify.json)."""
        return {**self.interval.to_json(), "pairs": self.pairs, **optional_fields(lower_bound=self.lower_bound)}

    @field_serializer("median_interval")
    def _bounds(self, interval: Interval) -> JsonObject:
        return interval.bounds_json()  # written beside the median it is around: its ends alone

    @model_validator(mode="before")
    @classmethod
    def _around(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and isinstance(data.get("median_interval"), Mapping) and "median" in data:
            return {**data, "median_interval": Interval.around(data["median"], data["median_interval"])}
        return data


@dataclasses.dataclass(frozen=True, kw_only=True)
class Standalone(Flattened, Record):
    """The standalone check's figures: the pairs' rates, both sides, and the speedup
    (written as its own keys among them)."""

    speedup: VerifiedSpeedup
    ratios: tuple[float, ...]
    samples_per_s: tuple[float, ...]
    baseline_samples_per_s: tuple[float, ...]
    median_samples_per_s: float
    baseline_median_samples_per_s: float
    served_over_alone: Mapping[str, float]  # candidate, baseline: side by side over alone
    cap: Omitted[int] = None  # the most pairs it would have run (--pairs)
    stopped: Omitted[str] = None  # why the pairs ended before the cap
    peak_mb: Omitted[float] = None  # the emitted script's busiest rank at its peak, the most of its runs
    overlapped: OmittedEmpty[bool] = False  # each run set up while the one before it trained

    FLAT: ClassVar[str] = "speedup"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def interval(self) -> str:
        """What the interval covers: a re-run of as many pairs."""
        return "rerun"

    @classmethod
    def from_check(cls, check: Check | None) -> Standalone | None:
        """The figures of a standalone check; None when it did not run or its script failed."""
        if check is None or "ratios" not in check.detail:
            return None
        return cls.from_json(check.detail)


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
class CandidateOutcome(Record):
    """One candidate of the verification: its side-by-side speed over the baseline (the
    median and interval of its rounds, and its rate relative to the candidates' level;
    None each where it was not measured) and what became of it."""

    config: TrialConfig
    median: float | None
    ci_low: float | None
    ci_high: float | None
    relative_to_candidates: float | None
    checks: tuple[str, ...]
    outcome: str

    @computed_field  # type: ignore[prop-decorator]
    @property
    def config_short(self) -> str:
        return self.config.short()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rejection(Record):
    config: TrialConfig
    reason: str
    checks: Mapping[str, Check]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def config_short(self) -> str:
        return self.config.short()


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrecisionNote(Record):
    """Which precision was chosen, how it was checked, why others were not, how to opt out.
    ``inconclusive``: the faster precisions whose quality check could not tell within the seeds
    verification holds, with its figures; ``judged``: what the quality check found for each configuration it judged,
    by its short name."""

    chosen: str
    rejected: Mapping[str, str]
    instead: str
    skipped: Mapping[str, str]
    checked: Omitted[str] = None
    opt_out: Omitted[str] = None
    # only where the quality check ran: a document without one reads as an earlier version wrote it
    inconclusive: OmittedEmpty[Mapping[str, str]] = dataclasses.field(default_factory=dict)
    judged: OmittedEmpty[Mapping[str, QualityJudgement]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayoutEffect(Inline, Record):
    """Several ranks against one process on all cores, every other knob equal."""

    multi_rank: str
    single_process: str
    other_knobs: Mapping[str, KnobValue]
    effect: Interval  # the multi-rank layout's speed over the single process's


@dataclasses.dataclass(frozen=True, kw_only=True)
class Baseline(Record):
    config: TrialConfig
    samples_per_s: float
    runs: tuple[float, ...]  # the rates its figure is the median of


@dataclasses.dataclass(frozen=True, kw_only=True)
class Best(Record):
    """The emitted configuration's rate (from the standalone pairs) and what the search
    measured of its memory and one-time cost; the GPU's peak where it ran on one."""

    samples_per_s: float
    peak_mem_mb: float | None
    one_time_s: float | None
    # where it ran on a GPU: host memory says nothing of the GPU's
    cuda_peak_mb: Omitted[float] = None
    cuda_total_mb: Omitted[float] = None
