"""Why the winner won: each knob where it differs from the baseline, reverted to the
baseline's value one at a time, measured side by side with the winner; and, on request
(``--path``), the path from the baseline to the winner, one knob added at a time,
measured in the same rounds.

The variants and the winner are held alive together and measured one window each in
turn, round after round (``side_by_side.speed_check``: the verification method), so a
knob's worth is a paired ratio, winner over variant, with an interval. A knob whose
removal costs nothing measurable (its interval reaches 1.0) is dropped from the emitted
configuration: simpler is better when equal (``NEGLIGIBLE``). The rounds are sized so
the session measures no more windows than the speed check before it; a variant whose
effect is settled is measured no more (``sequential.Effects``), and where the speed check
already measured a configuration beside the winner, its rounds are used instead
(``reusable``).

The two answer different questions. Leave-one-out says what each knob costs if it alone
is removed; when knobs are complementary (reduced precision pays most at a large batch)
each removal costs more than that knob's share, and these ratios multiply to more than
the whole. The path's steps (geometric means over the same rounds) multiply to the
winner's speed over the baseline's by construction; each step is the knob's worth given
the knobs added before it, in ``KNOB_GROUPS`` order.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from autotune.config import KnobValue, TrialConfig
from autotune.document.ablation import Ablation, AblationPath, KnobEffect, PathStep
from autotune.document.interval import Interval
from autotune.document.stages import Stage
from autotune.errors import AutotuneError, UsageError
from autotune.runtime.knobs import Device
from autotune.space.gpu import normalised
from autotune.trials.progress import Progress, VerifyStep, no_progress
from autotune.trials.protocol import ProgressEvent
from autotune.trials.runner import TrialRunnerLike
from autotune.verify import stats
from autotune.verify.device_room import DeviceRoom
from autotune.verify.sequential import FEWEST, Effects, settled
from autotune.verify.side_by_side import Held, speed_check

# Knobs that only make sense together are reverted together.
KNOB_GROUPS: dict[str, tuple[str, ...]] = {
    "layout": ("nprocs", "threads", "backend"),
    "batch_size": ("batch_size",),
    # without workers a configuration prefetches nothing (TrialConfig): reverting them
    # reverts prefetch_factor too, and prefetch_factor alone reverts to torch's default
    "num_workers": ("num_workers", "persistent_workers"),
    "pin_memory": ("pin_memory",),
    "interop_threads": ("interop_threads",),
    "compile": ("compile",),
    "precision": ("precision",),
    "channels_last": ("channels_last",),
    "prune_ratio": ("prune_ratio",),
    "allocator": ("allocator",),
    "affinity": ("affinity",),
    "ipex": ("ipex",),
    "cudnn_benchmark": ("cudnn_benchmark",),
    "prefetch_factor": ("prefetch_factor",),  # after num_workers: on the path it needs them
    "optimizer_step": ("optimizer_step",),
    # the GPU knobs (space.gpu): float8 after precision and compile, which it needs
    "expandable_segments": ("expandable_segments",),
    "float8": ("float8",),
    "ddp_bucket_view": ("ddp_bucket_view",),
    "ddp_static_graph": ("ddp_static_graph",),
}
MIN_ROUNDS = 3  # with many knobs: the path and the leave-one-out in the speed check's windows
MAX_ROUNDS = 10
# A knob is dropped when its interval reaches 1.0 and its median is under this: not
# shown to help, and most likely worth little. One whose median is above it but whose
# interval reaches 1.0 (a noisy machine) is kept: dropping it would bet on the noise.
NEGLIGIBLE = 1.05


@dataclasses.dataclass(frozen=True)
class Variant:
    knob: str
    config: TrialConfig  # the winner with this knob at the baseline's value


def _value(cfg: TrialConfig, knob: str) -> Any:
    if knob == "layout":
        return cfg.layout
    if knob == "num_workers" and cfg.num_workers and cfg.persistent_workers:
        return f"{cfg.num_workers} persistent"
    return getattr(cfg, KNOB_GROUPS[knob][0])


# Knobs that do nothing on a device: pinned memory and cuDNN's search need a GPU; GPU
# ranks are not pinned to cores (``trials.launch.environment``).
# The CUDA allocator's options likewise.
_INERT = {Device.CPU: ("pin_memory", "cudnn_benchmark", "expandable_segments"), Device.CUDA: ("affinity",)}


def _in_effect(cfg: TrialConfig) -> TrialConfig:
    """``cfg`` as it runs: its knobs that do nothing on its device at their defaults."""
    return cfg.replace(**{f: getattr(TrialConfig, f) for f in _INERT.get(cfg.device, ())})


def variants(winner: TrialConfig, baseline: TrialConfig, *,
             pinned: Collection[str] = ()) -> list[Variant]:
    """One variant per knob group where the winner differs from the baseline. A knob the
    user pinned (``--fix``; field names) is theirs, not measured or dropped; a revert
    that makes no valid configuration (a batch the ranks cannot split) is left out.

    No variant runs as the winner does: one that differs from it only in knobs that do
    nothing on its device (pinned memory and cuDNN's search on CPU, core pinning on GPUs)
    would measure the winner against itself, and is left out. One that runs as the
    baseline does is the baseline itself, held once (``session_configs``)."""
    out = []
    for knob, fields in KNOB_GROUPS.items():
        if any(f in pinned for f in fields):
            continue
        changes = {f: getattr(baseline, f) for f in fields if getattr(winner, f) != getattr(baseline, f)}
        if not changes:
            continue
        try:  # without the knobs the reverted one leaves nothing to act on (float8 without bf16)
            cfg = TrialConfig.from_dict(normalised({**winner.to_dict(), **changes}))
        except UsageError:
            continue
        if _in_effect(cfg) == _in_effect(winner):
            continue
        out.append(Variant(knob, baseline if _in_effect(cfg) == _in_effect(baseline) else cfg))
    return out


@dataclasses.dataclass(frozen=True)
class Step:
    knobs: tuple[str, ...]  # added at this step (several when one alone is no valid config)
    config: TrialConfig  # the baseline with every knob up to this step at the winner's value


def steps_from(winner: TrialConfig, baseline: TrialConfig) -> list[Step]:
    """From the baseline to the winner, one knob group at a time in ``KNOB_GROUPS``
    order; the last step's configuration is the winner."""
    steps: list[Step] = []
    pending: list[str] = []
    changes: dict[str, KnobValue] = {}
    for knob, fields in KNOB_GROUPS.items():
        diff = {f: getattr(winner, f) for f in fields if getattr(winner, f) != getattr(baseline, f)}
        if not diff:
            continue
        pending.append(knob)
        changes.update(diff)
        try:
            cfg = baseline.replace(**changes)
        except UsageError:  # e.g. a batch the ranks cannot split yet: goes with the next knob
            continue
        steps.append(Step(tuple(pending), cfg))
        pending = []
    if steps and (pending or steps[-1].config != winner):
        steps[-1] = Step(steps[-1].knobs + tuple(pending), winner)
    return steps


def session_configs(winner: TrialConfig, baseline: TrialConfig, *,
                    pinned: Collection[str] = (), path: bool = False) -> list[TrialConfig]:
    """What the ablation holds beside the winner: the leave-one-out variants and, with
    ``path``, the baseline and the path's intermediate configurations, each once."""
    configs = [v.config for v in variants(winner, baseline, pinned=pinned)]
    if path:  # a step that runs as the winner (or the baseline) is measured as it: its knobs go with the next
        configs += [baseline] + [s.config for s in steps_from(winner, baseline)[:-1]
                                 if _in_effect(s.config) not in (_in_effect(winner), _in_effect(baseline))]
    return list(dict.fromkeys(c for c in configs if _in_effect(c) != _in_effect(winner)))


def rounds_for(variant_count: int, *, speed_windows: int) -> int:
    """As many rounds as keep the session within the speed check's windows."""
    return max(MIN_ROUNDS, min(MAX_ROUNDS, speed_windows // (variant_count + 1)))


def reusable(winner: TrialConfig, baseline: TrialConfig, configs: list[TrialConfig], *,
             measured: Mapping[TrialConfig, Sequence[float]], pinned: Collection[str] = (),
             path: bool = False) -> dict[TrialConfig, list[float]]:
    """Ratios to the winner, round by round, that the speed check's rounds already hold
    (``measured``: each configuration's rate per round there, the winner's among them):
    the same configuration beside the winner, measured the same way. Every one of the
    session's when the speed check measured them all (no session is needed then); else the
    leave-one-out variants whose effect those rounds settle and that the path does not
    need (the path's steps must share the session's rounds to multiply to the whole)."""
    if winner not in measured:
        return {}
    ratios = {c: [v / w for v, w in zip(measured[c], measured[winner])]
              for c in configs if c in measured and len(measured[c]) >= 2}
    if len(ratios) == len(configs):
        return ratios
    on_path = {baseline} | {s.config for s in steps_from(winner, baseline)[:-1]} if path else set()
    deciding = {v.config for v in variants(winner, baseline, pinned=pinned)} - on_path
    return {c: r for c, r in ratios.items()
            if c in deciding and len(r) >= FEWEST and settled(stats.ratio_interval([1 / x for x in r]))}


def measure(runner: TrialRunnerLike, winner: TrialConfig, baseline: TrialConfig, *, rounds: int,
            pinned: Collection[str] = (), path: bool = False,
            measured: Mapping[TrialConfig, Sequence[float]] | None = None,
            progress: Progress = no_progress, pool: Held | None = None,
            fits: Callable[[TrialConfig], bool] = lambda cfg: True, room: DeviceRoom | None = None) -> Ablation:
    """Per knob, the winner's speed over the variant's (ratio > 1: the knob helps) with
    its interval, and whether it is kept; with ``path``, the path from the baseline. ``rounds`` is
    the session's cap; ``measured`` the speed check's rates per round, which spare the
    session what they already settle (``reusable``). No knobs when the winner differs
    from the baseline in none; ``skipped`` when the winner could not be held for it.
    ``pool``: processes the speed check left running (``side_by_side.Held``); ``fits``:
    whether a configuration is known to fit in memory (a knob without which the winner
    is not is kept, whatever its effect); ``room``: what may be held on the GPUs
    (``device_room``)."""
    found = variants(winner, baseline, pinned=pinned)
    steps = steps_from(winner, baseline) if path else []
    if not found and len(steps) < 2:
        return Ablation()
    configs = session_configs(winner, baseline, pinned=pinned, path=path)
    reused = reusable(winner, baseline, configs, measured=measured or {}, pinned=pinned, path=path)
    detail: dict[TrialConfig, Any] = {c: {"ratios": r, "reused": True} for c, r in reused.items()}
    held = [c for c in configs if c not in reused]
    if held:
        on_path = {baseline} | {s.config for s in steps[:-1]} if path else set()
        deciding = {v.config for v in found}
        rule = Effects(deciding=frozenset(i for i, c in enumerate(held, 1) if c in deciding),
                       kept=frozenset(i for i, c in enumerate(held, 1) if c in on_path))
        progress(ProgressEvent.STEP,
                 VerifyStep(f"ablation: the winner against itself with each of "
                            f"{', '.join(v.knob for v in found if v.config in held) or 'no knob'} at the "
                            f"baseline's value{', and the path from the baseline one knob at a time' if path else ''} "
                            f"({len(held)} configurations), up to {rounds} rounds side by side",
                            stage=Stage.ABLATION.value))
        try:
            speed, checks = speed_check(runner, winner, held, rounds=rounds, progress=progress,
                                        name="verify-ablation", reference_label="reference", rule=rule,
                                        held=pool, room=room)
        except AutotuneError as exc:
            return Ablation(skipped=f"the winner could not be held for the ablation: {exc}")
        detail.update({cfg: check.detail for cfg, check in zip(held, checks)})
        ran, stopped, rate = speed.rounds, speed.stopped, speed.median_samples_per_s
    else:
        assert measured is not None  # everything was reused from it
        ran, rate = min(len(r) for r in reused.values()), statistics.median(measured[winner])
        stopped = "the speed check measured every configuration beside the winner: its rounds were used"
    knobs = tuple(_knob_effect(v, detail[v.config], winner, baseline, fits=fits(v.config)) for v in found)
    kept = [k.effect.ratio for k in knobs if k.kept and k.effect is not None]
    return Ablation(knobs=knobs, rounds=ran, cap=rounds, stopped=stopped, winner_samples_per_s=rate,
                    product=math.prod(kept) if kept else 1.0,
                    path=_path_effects(steps, detail, winner, baseline,
                                       removed={k.knob for k in knobs if not k.kept}) if path else None)


def _path_effects(steps: list[Step], detail: dict[TrialConfig, Any], winner: TrialConfig,
                  baseline: TrialConfig, *, removed: Collection[str]) -> AblationPath:
    """Each step's speed over the previous step's, round by round; a configuration that
    failed is skipped (its knobs go with the next step). The steps' ratios multiply to
    ``total``, the winner's speed over the baseline's in the same rounds; ``kept_product``
    leaves out the steps whose knobs the leave-one-out found worth nothing (``removed``)."""
    base = detail.get(baseline, {}).get("ratios")
    if not base:
        return AblationPath(skipped="the baseline could not be measured beside the winner: "
                                    f"{detail.get(baseline, {}).get('reason', 'failed')}")
    # per point on the path, its speed over the winner's, round by round
    points: list[tuple[tuple[str, ...], list[float]]] = [((), base)]
    carried: tuple[str, ...] = ()
    for step in steps:
        ratios = [1.0] * len(base) if step.config == winner else detail.get(step.config, {}).get("ratios")
        if not ratios:
            carried += step.knobs
            continue
        points.append((carried + step.knobs, ratios))
        carried = ()
    rounds = min(len(r) for _, r in points)
    out = []
    for (_, before), (knobs, after) in zip(points, points[1:]):
        effect = stats.geometric_interval([a / b for a, b in zip(after[:rounds], before[:rounds])])
        out.append(PathStep(knobs=knobs, baseline=tuple(_value(baseline, k) for k in knobs),
                            winner=tuple(_value(winner, k) for k in knobs),
                            kept=not all(k in removed for k in knobs),
                            effect=_effect(effect), rounds=rounds))
    total = stats.geometric_interval([1 / r for r in base[:rounds]])
    kept = [s.effect.ratio for s in out if s.kept]
    return AblationPath(steps=tuple(out), total=_effect(total), rounds=rounds,
                        kept_product=math.prod(kept) if kept else 1.0)


def _effect(interval: Interval) -> Interval:
    """The document's effect leaves out the rounds: a step and the path record them beside it."""
    return dataclasses.replace(interval, rounds=None)


def _knob_effect(variant: Variant, detail: Any, winner: TrialConfig,
                 baseline: TrialConfig, *, fits: bool = True) -> KnobEffect:
    named = {"knob": variant.knob, "baseline": _value(baseline, variant.knob),
             "winner": _value(winner, variant.knob)}
    ratios = detail.get("ratios")
    if not ratios:  # the variant failed: the knob may be what makes the winner run at all
        return KnobEffect(**named, kept=True, note=f"could not be measured without it: "
                                                   f"{detail.get('reason', 'failed')}")
    interval = stats.ratio_interval([1 / r for r in ratios])
    measurable = interval.low > 1.0
    kept = measurable or interval.ratio >= NEGLIGIBLE
    if measurable:
        note = ""
    elif kept:
        note = "not measurably faster, but likely worth keeping: kept"
    elif interval.high < 1.0:  # the search's pick, by noise or for another knob's sake
        note = "slows the winner down: removed from the emitted configuration"
    else:
        note = "no measurable effect: removed from the emitted configuration"
    if not kept and not fits:
        kept, note = True, "no measurable effect, but kept: without it the configuration is not known to fit in memory"
    if detail.get("reused"):
        note = "; ".join(filter(None, [note, "measured in the speed check's rounds"]))
    effect = _effect(interval)
    return KnobEffect(**named, kept=kept, note=note, effect=effect, rounds=len(ratios))


def simplified(winner: TrialConfig, baseline: TrialConfig, ablation: Ablation) -> TrialConfig:
    """The winner with every knob the ablation found no effect of at the baseline's value."""
    changes: dict[str, KnobValue] = {}
    for knob in ablation.knobs:
        if not knob.kept:
            changes.update({f: getattr(baseline, f) for f in KNOB_GROUPS[knob.knob]})
    try:
        return winner.replace(**changes)
    except UsageError:
        return winner
