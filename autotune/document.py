"""What a run measured and decided, as typed values: ``RunDocument`` is ``best_config.json``.

Each stage builds its own part (the verification its checks, the standalone pairs and the
ablation; the pipeline the baseline, the precision note and the document itself), and
the document is serialized once, by ``RunDocument.to_json``. The JSON key names live
here and nowhere else; ``autotune/schemas/best_config.schema.json`` pins the same shape.

An unverified run has no speedup (``"speedup": null``): nothing was measured against the
baseline, and a ratio of 1.0 over no pairs would read like a measurement.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from autotune.config import TrialConfig

# Where the printed speedup's interval comes from, as best_config.json tells its reader.
STANDALONE_COVERS = ("where a re-measurement of as many pairs of the emitted launch.sh against "
                     "the baseline's script, each run alone on this machine, alternating, is "
                     "expected to land, from the run-to-run spread seen while verifying")


def _optional(**fields: Any) -> dict[str, Any]:
    """The fields that are set: an absent key, not a null, where a part did not happen."""
    return {k: v for k, v in fields.items() if v is not None}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Interval:
    """A median ratio and the interval around it, at ``ci_level``."""

    median: float
    ci_low: float
    ci_high: float
    ci_level: float

    def to_json(self) -> dict[str, Any]:
        return {"median": self.median, "ci_low": self.ci_low, "ci_high": self.ci_high,
                "ci_level": self.ci_level}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Interval:
        """Also reads ``autotune.verify.stats.ratio_interval``'s result, which has these keys."""
        return cls(median=data["median"], ci_low=data["ci_low"], ci_high=data["ci_high"],
                   ci_level=data["ci_level"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Effect:
    """A geometric-mean ratio (``autotune.verify.stats.geometric_interval``) and its interval."""

    ratio: float
    ci_low: float
    ci_high: float
    ci_level: float

    def to_json(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "ci_low": self.ci_low, "ci_high": self.ci_high,
                "ci_level": self.ci_level}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Effect:
        return cls(ratio=data["ratio"], ci_low=data["ci_low"], ci_high=data["ci_high"],
                   ci_level=data["ci_level"])


@dataclasses.dataclass(frozen=True)
class Check:
    """One verification check: passed, failed, or None where it does not apply; ``detail``
    holds its figures and, where it failed or did not apply, its ``reason``."""

    passed: bool | None
    detail: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def reason(self) -> str | None:
        return self.detail.get("reason")

    def to_json(self) -> dict[str, Any]:
        return {"passed": self.passed, **self.detail}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Check:
        return cls(data["passed"], {k: v for k, v in data.items() if k != "passed"})


@dataclasses.dataclass(frozen=True, kw_only=True)
class Speedup:
    """The printed speedup: the standalone pairs' median ratio and where a re-measurement
    of as many pairs lands (``interval``); ``median_interval`` is the median's own
    distribution-free interval (what the check tests against 1.0); ``side_by_side`` the
    same two configurations' ratio in the verification's side-by-side rounds."""

    interval: Interval
    pairs: int
    seconds_per_run: float
    wall_s: float
    median_interval: Interval
    side_by_side: Interval
    unsteady: str | None = None  # why the figure may not hold, when the pairs ranged widely
    covers: str = STANDALONE_COVERS

    def headline(self) -> dict[str, Any]:
        """The figures a re-verification prints and compares (reverify.json)."""
        return {**self.interval.to_json(), "pairs": self.pairs}

    def to_json(self) -> dict[str, Any]:
        mi = self.median_interval
        return {**self.interval.to_json(), "pairs": self.pairs,
                "seconds_per_run": self.seconds_per_run, "wall_s": self.wall_s,
                "covers": self.covers,
                "median_interval": {"low": mi.ci_low, "high": mi.ci_high, "level": mi.ci_level},
                "side_by_side": self.side_by_side.to_json(), **_optional(unsteady=self.unsteady)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Speedup:
        mi = data["median_interval"]
        return cls(interval=Interval.from_json(data), pairs=data["pairs"],
                   seconds_per_run=data["seconds_per_run"], wall_s=data["wall_s"],
                   median_interval=Interval(median=data["median"], ci_low=mi["low"],
                                            ci_high=mi["high"], ci_level=mi["level"]),
                   side_by_side=Interval.from_json(data["side_by_side"]),
                   unsteady=data.get("unsteady"), covers=data["covers"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Standalone:
    """The standalone check's figures: the pairs' rates, both sides, and the speedup."""

    speedup: Speedup
    ratios: tuple[float, ...]
    samples_per_s: tuple[float, ...]
    baseline_samples_per_s: tuple[float, ...]
    median_samples_per_s: float
    baseline_median_samples_per_s: float
    served_over_alone: Mapping[str, float]  # candidate, baseline: side by side over alone

    def to_json(self) -> dict[str, Any]:
        sp = self.speedup.to_json()
        return {**self.speedup.interval.to_json(), "interval": "rerun",
                "median_interval": sp["median_interval"], "pairs": self.speedup.pairs,
                "ratios": list(self.ratios), "samples_per_s": list(self.samples_per_s),
                "median_samples_per_s": self.median_samples_per_s,
                "baseline_samples_per_s": list(self.baseline_samples_per_s),
                "baseline_median_samples_per_s": self.baseline_median_samples_per_s,
                "seconds_per_run": self.speedup.seconds_per_run, "wall_s": self.speedup.wall_s,
                "side_by_side": sp["side_by_side"], "served_over_alone": dict(self.served_over_alone),
                "covers": self.speedup.covers, **_optional(unsteady=self.speedup.unsteady)}

    @classmethod
    def from_check(cls, check: Check | None) -> Standalone | None:
        """The figures of a standalone check; None when it did not run or its script failed."""
        if check is None or "ratios" not in check.detail:
            return None
        d = check.detail
        return cls(speedup=Speedup.from_json(d), ratios=tuple(d["ratios"]),
                   samples_per_s=tuple(d["samples_per_s"]),
                   baseline_samples_per_s=tuple(d["baseline_samples_per_s"]),
                   median_samples_per_s=d["median_samples_per_s"],
                   baseline_median_samples_per_s=d["baseline_median_samples_per_s"],
                   served_over_alone=d["served_over_alone"])


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
class KnobEffect:
    """One knob's worth to the winner: the winner's speed over the winner with that knob at
    the baseline's value (``effect``; None where that variant could not be measured)."""

    knob: str
    baseline: Any
    winner: Any
    kept: bool
    note: str
    effect: Effect | None = None

    def to_json(self) -> dict[str, Any]:
        return {"knob": self.knob, "baseline": self.baseline, "winner": self.winner,
                **(self.effect.to_json() if self.effect else {}), "kept": self.kept,
                "note": self.note}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KnobEffect:
        return cls(knob=data["knob"], baseline=data["baseline"], winner=data["winner"],
                   kept=data["kept"], note=data["note"],
                   effect=Effect.from_json(data) if "ratio" in data else None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PathStep:
    """Knobs added on the path from the baseline, and the speed they added given the
    knobs before them."""

    knobs: tuple[str, ...]
    baseline: tuple[Any, ...]
    winner: tuple[Any, ...]
    kept: bool
    effect: Effect
    rounds: int

    def to_json(self) -> dict[str, Any]:
        return {"knobs": list(self.knobs), "baseline": list(self.baseline),
                "winner": list(self.winner), "kept": self.kept, **self.effect.to_json(),
                "rounds": self.rounds}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PathStep:
        return cls(knobs=tuple(data["knobs"]), baseline=tuple(data["baseline"]),
                   winner=tuple(data["winner"]), kept=data["kept"], effect=Effect.from_json(data),
                   rounds=data["rounds"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class AblationPath:
    """The path from the baseline to the winner; ``total`` (the winner over the baseline)
    is what the steps multiply to. ``skipped``: why it was not measured (then nothing else)."""

    steps: tuple[PathStep, ...] = ()
    total: Effect | None = None
    rounds: int = 0
    kept_product: float = 1.0
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        if self.skipped is not None or self.total is None:
            return {"skipped": self.skipped}
        t = self.total
        return {"steps": [s.to_json() for s in self.steps], "total": t.ratio, "ci_low": t.ci_low,
                "ci_high": t.ci_high, "ci_level": t.ci_level, "rounds": self.rounds,
                "kept_product": self.kept_product}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AblationPath:
        if "skipped" in data:
            return cls(skipped=data["skipped"])
        return cls(steps=tuple(PathStep.from_json(s) for s in data["steps"]),
                   total=Effect(ratio=data["total"], ci_low=data["ci_low"],
                                ci_high=data["ci_high"], ci_level=data["ci_level"]),
                   rounds=data["rounds"], kept_product=data["kept_product"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class Simplified:
    """The winner less the knobs worth nothing measurable: ``dropped`` from ``from_``;
    ``rejected`` says why it was not emitted, when it was not."""

    config: str
    dropped: tuple[str, ...] | None = None
    from_: str | None = None
    rejected: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config,
                **_optional(dropped=None if self.dropped is None else list(self.dropped),
                            rejected=self.rejected),
                **_optional(**{"from": self.from_})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Simplified:
        dropped = data.get("dropped")
        return cls(config=data["config"], dropped=None if dropped is None else tuple(dropped),
                   from_=data.get("from"), rejected=data.get("rejected"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ablation:
    """Why the winner won (``autotune.verify.ablation``): each knob's worth, the path from the
    baseline, and the simplified configuration; ``skipped`` when it could not be measured."""

    knobs: tuple[KnobEffect, ...] = ()
    rounds: int | None = None
    winner_samples_per_s: float | None = None
    product: float | None = None  # the kept knobs' leave-one-out ratios multiplied
    path: AblationPath | None = None
    simplified: Simplified | None = None
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"knobs": [k.to_json() for k in self.knobs],
                **_optional(rounds=self.rounds, winner_samples_per_s=self.winner_samples_per_s,
                            product=self.product,
                            path=self.path.to_json() if self.path else None,
                            simplified=self.simplified.to_json() if self.simplified else None,
                            skipped=self.skipped)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Ablation:
        return cls(knobs=tuple(KnobEffect.from_json(k) for k in data["knobs"]),
                   rounds=data.get("rounds"), winner_samples_per_s=data.get("winner_samples_per_s"),
                   product=data.get("product"),
                   path=AblationPath.from_json(data["path"]) if "path" in data else None,
                   simplified=(Simplified.from_json(data["simplified"])
                               if "simplified" in data else None),
                   skipped=data.get("skipped"))


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

    def to_json(self) -> dict[str, Any]:
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

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "config_short": self.config.short(),
                "reason": self.reason, "checks": {n: c.to_json() for n, c in self.checks.items()}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Rejection:
        return cls(config=TrialConfig.from_dict(data["config"]), reason=data["reason"],
                   checks={n: Check.from_json(c) for n, c in data["checks"].items()})


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrecisionNote:
    """Which precision was chosen, how it was checked, why others were not, how to opt out."""

    chosen: str
    rejected: Mapping[str, str]
    instead: str
    skipped: Mapping[str, str]
    checked: str | None = None
    opt_out: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"chosen": self.chosen, **_optional(checked=self.checked),
                "rejected": dict(self.rejected), "instead": self.instead,
                **_optional(opt_out=self.opt_out), "skipped": dict(self.skipped)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PrecisionNote:
        return cls(chosen=data["chosen"], rejected=data["rejected"], instead=data["instead"],
                   skipped=data["skipped"], checked=data.get("checked"), opt_out=data.get("opt_out"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class LayoutEffect:
    """Several ranks against one process on all cores, every other knob equal."""

    multi_rank: str
    single_process: str
    other_knobs: Mapping[str, Any]
    effect: Interval  # the multi-rank layout's speed over the single process's

    def to_json(self) -> dict[str, Any]:
        e = self.effect
        return {"multi_rank": self.multi_rank, "single_process": self.single_process,
                "other_knobs": dict(self.other_knobs), "ratio": e.median, "ci_low": e.ci_low,
                "ci_high": e.ci_high, "ci_level": e.ci_level}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LayoutEffect:
        return cls(multi_rank=data["multi_rank"], single_process=data["single_process"],
                   other_knobs=data["other_knobs"],
                   effect=Interval(median=data["ratio"], ci_low=data["ci_low"],
                                   ci_high=data["ci_high"], ci_level=data["ci_level"]))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Baseline:
    config: TrialConfig
    samples_per_s: float
    runs: tuple[float, ...]  # the rates its figure is the median of

    def to_json(self) -> dict[str, Any]:
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

    def to_json(self) -> dict[str, Any]:
        out = {"samples_per_s": self.samples_per_s, "peak_mem_mb": self.peak_mem_mb,
               "one_time_s": self.one_time_s}
        if self.cuda_peak_mb is not None:  # host memory says nothing of the GPU's
            out.update(cuda_peak_mb=self.cuda_peak_mb, cuda_total_mb=self.cuda_total_mb)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Best:
        return cls(samples_per_s=data["samples_per_s"], peak_mem_mb=data["peak_mem_mb"],
                   one_time_s=data["one_time_s"], cuda_peak_mb=data.get("cuda_peak_mb"),
                   cuda_total_mb=data.get("cuda_total_mb"))


def _list(items: Sequence[Any]) -> list[dict[str, Any]]:
    return [item.to_json() for item in items]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunDocument:
    """best_config.json. ``schema``, ``model_file_tuned``, ``launch`` and ``outputs`` are
    added where the files are written (``autotune.emit.outputs.write_outputs``); a document read
    back from the folder carries them."""

    model_file: str
    autotune_version: str
    fingerprint: Mapping[str, Any]
    config: TrialConfig
    baseline: Baseline
    best: Best | None  # None: nothing verified, the baseline is emitted
    speedup: Speedup | None  # None: nothing verified, nothing measured against the baseline
    verification: Mapping[str, Check]  # the emitted configuration's checks
    precision: PrecisionNote
    rejected: tuple[Rejection, ...]
    candidates: tuple[CandidateOutcome, ...]
    search: Mapping[str, Any]
    space: Mapping[str, Any]
    layout_effect: LayoutEffect | None
    environment: Mapping[str, str]
    ablation: Ablation | None = None
    schema: int | None = None
    model_file_tuned: str | None = None
    launch: str | None = None
    outputs: Mapping[str, str] | None = None

    @property
    def verified(self) -> bool:
        return self.speedup is not None

    @property
    def included(self) -> Mapping[str, Sequence[Any]]:
        """The search space: each knob's values (one value: not searched)."""
        return self.space.get("included") or {}

    @property
    def excluded(self) -> Mapping[str, str]:
        """What the search left out on this machine ("knob" or "knob=value"), and why."""
        return self.space.get("excluded") or {}

    @property
    def side_by_side_rounds(self) -> Rounds | None:
        """The speed check's rounds, the emitted configuration and the baseline side by side."""
        return Rounds.from_check(self.verification.get("speed"))

    @property
    def standalone_pairs(self) -> Rounds | None:
        """The standalone pairs the printed speedup comes from."""
        return Rounds.from_check(self.verification.get("standalone"))

    def to_json(self) -> dict[str, Any]:
        return {
            **_optional(schema=self.schema),
            "model_file": self.model_file, "autotune_version": self.autotune_version,
            "fingerprint": dict(self.fingerprint), "config": self.config.to_dict(),
            "baseline": self.baseline.to_json(), "verified": self.verified,
            "best": self.best.to_json() if self.best else None,
            "speedup": self.speedup.to_json() if self.speedup else None,
            "verification": {name: c.to_json() for name, c in self.verification.items()},
            "precision": self.precision.to_json(), "rejected": _list(self.rejected),
            "candidates": _list(self.candidates), "search": dict(self.search),
            "space": dict(self.space),
            "layout_effect": self.layout_effect.to_json() if self.layout_effect else None,
            **_optional(ablation=self.ablation.to_json() if self.ablation else None),
            "environment": dict(self.environment),
            **_optional(model_file_tuned=self.model_file_tuned, launch=self.launch,
                        outputs=None if self.outputs is None else dict(self.outputs)),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunDocument:
        """A document as ``to_json`` (or ``emit.write_outputs``) wrote it."""
        effect, ablation = data.get("layout_effect"), data.get("ablation")
        return cls(
            model_file=data["model_file"], autotune_version=data["autotune_version"],
            fingerprint=data["fingerprint"], config=TrialConfig.from_dict(data["config"]),
            baseline=Baseline.from_json(data["baseline"]),
            best=Best.from_json(data["best"]) if data.get("best") else None,
            speedup=Speedup.from_json(data["speedup"]) if data.get("speedup") else None,
            verification={n: Check.from_json(c) for n, c in data["verification"].items()},
            precision=PrecisionNote.from_json(data["precision"]),
            rejected=tuple(Rejection.from_json(r) for r in data["rejected"]),
            candidates=tuple(CandidateOutcome.from_json(c) for c in data["candidates"]),
            search=data["search"], space=data["space"],
            layout_effect=LayoutEffect.from_json(effect) if effect else None,
            environment=data["environment"],
            ablation=Ablation.from_json(ablation) if ablation else None,
            schema=data.get("schema"), model_file_tuned=data.get("model_file_tuned"),
            launch=data.get("launch"), outputs=data.get("outputs"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class CandidateDocument:
    """best_config.json beside the scripts of a configuration that a verification runs (not
    a run's result): which configuration they train, and where the files are, as
    ``autotune.emit.outputs.write_candidate`` wrote them."""

    config: TrialConfig
    model_file: str
    model_file_tuned: str
    launch: str
    outputs: Mapping[str, str]
    schema: int

    def to_json(self) -> dict[str, Any]:
        return {"schema": self.schema, "candidate": self.config.to_dict(), "model_file": self.model_file,
                "model_file_tuned": self.model_file_tuned, "launch": self.launch,
                "outputs": dict(self.outputs)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CandidateDocument:
        return cls(config=TrialConfig.from_dict(data["candidate"]), model_file=data["model_file"],
                   model_file_tuned=data["model_file_tuned"], launch=data["launch"],
                   outputs=data["outputs"], schema=data["schema"])
