"""Memory as the search knows it: the most a rank may hold (``MemoryLimit``), where the
configurations measured so far say another one will not fit, and what to try where one
did not (``rescue``).

A trial reports its ranks' peak (``rank_peak_mb``: host memory on CPU, device memory on
CUDA). One over the limit is not chosen, as one that ran out of memory is not; either is
retried with the memory knobs (``space.MEMORY_KNOBS``) before its batch is written off.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from autotune.config import TrialConfig
from autotune.document.memory import BestWithout, MemoryFit
from autotune.errors import UsageError
from autotune.runtime.knobs import Device, Precision, Sharding
from autotune.search.trial_summary import TrialSummary
from autotune.space import Space
from autotune.trials.protocol import Failure

# The share of a GPU's memory a predicted peak may take: allocator fragmentation and
# cuDNN workspaces come on top of what the linear model counts.
MEMORY_HEADROOM = 0.95


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryLimit:
    """``user_mb``: ``--memory-limit``, per rank; ``host_mb``: what trials may take of this
    machine's memory, all ranks together (``harness.memory_limit``). Without the first, a
    CPU rank may hold its share of the second; a GPU rank what its device holds (CUDA
    itself refuses more)."""

    user_mb: float | None = None
    host_mb: float | None = None

    @property
    def source(self) -> str:
        return "--memory-limit" if self.user_mb is not None else "machine's memory less a margin"

    def per_rank_mb(self, cfg: TrialConfig) -> float | None:
        if self.user_mb is not None:
            return self.user_mb
        if cfg.device == Device.CUDA or not self.host_mb:
            return None
        return self.host_mb / cfg.nprocs

    def over(self, cfg: TrialConfig, result: TrialSummary) -> str | None:
        """Why ``cfg``, as measured (a trial's summary), may not be chosen; None if it fits."""
        limit, peak = self.per_rank_mb(cfg), result.rank_peak_mb
        if limit is None or peak is None or peak <= limit:
            return None
        return (f"held {peak:,.0f} MiB on a rank, over the {self.source} "
                f"({limit:,.0f} MiB a rank)")


def holds(cfg: TrialConfig) -> tuple[Any, ...]:
    """What, besides the batch, sets how much a rank of ``cfg`` holds: its ranks (not their
    threads), what its activations are made of (precision, pruning, compiled or not), the
    host allocator (glibc's keeps freed memory resident: its peaks run higher) and the
    memory knobs."""
    return tuple(getattr(cfg, name) for name in _HOLDS)


_HOLDS = ("nprocs", "precision", "prune_ratio", "compile", "allocator", "activation_checkpointing",
          "grad_accum", "sharding")


def saves_memory(cfg: TrialConfig) -> bool:
    """Whether a memory knob of ``cfg`` is on."""
    return bool(knobs_on(cfg))


def rescue(cfg: TrialConfig, space: Space, *, widen: bool = False) -> TrialConfig | None:
    """What to try where ``cfg`` ran out of memory: its knobs holding less, one step more
    than it. First the repeated blocks' activations recomputed (a forward again, the
    activations of one block kept), then weights, gradients and optimizer state sharded
    over its ranks, then the micro-batch halved by accumulating; last, with ``widen`` (the
    user's own configuration, one rank), the same batch over the most ranks with every knob
    on together (recomputed, sharded, the most micro-batches the batch splits into): the
    least the knobs can hold. None when no step is left (or the user pinned them off), and
    for a batch above the user's: these knobs keep the user's batch; a larger one that
    holds a smaller one's micro-batch trains at about the smaller one's speed."""
    if cfg.batch_size > space.baseline.batch_size:
        return None
    allowed = space.choices
    sharding = Sharding.FULL in allowed.get("sharding", ())
    if not cfg.activation_checkpointing and True in allowed.get("activation_checkpointing", ()):
        return cfg.replace(activation_checkpointing=True)
    if cfg.sharding == Sharding.OFF and cfg.nprocs > 1 and not cfg.ipex and sharding:
        return cfg.replace(sharding=Sharding.FULL.value)
    doubled = cfg.grad_accum * 2
    if doubled in allowed.get("grad_accum", ()) and cfg.batch_size % (cfg.nprocs * doubled) == 0:
        return cfg.replace(grad_accum=doubled)
    wider = [layout for layout in space.layouts if layout.nprocs > 1 and cfg.batch_size % layout.nprocs == 0]
    if widen and cfg.nprocs == 1 and wider and sharding and not cfg.ipex:
        most = max(wider, key=lambda layout: (layout.nprocs, layout.threads or 0))
        accum = max((a for a in allowed.get("grad_accum", ()) if cfg.batch_size % (most.nprocs * a) == 0),
                    default=1)
        return cfg.replace(nprocs=most.nprocs, threads=most.threads, sharding=Sharding.FULL.value, grad_accum=accum,
                           activation_checkpointing=cfg.activation_checkpointing
                           or True in allowed.get("activation_checkpointing", ()))
    return None


def ladder(cfg: TrialConfig, space: Space) -> list[TrialConfig]:
    """``cfg`` (the user's own configuration) and each step ``rescue`` takes from it, each
    holding less, to the least the knobs can hold."""
    steps = [cfg]
    while len(steps) < 64 and (held := rescue(steps[-1], space, widen=True)) is not None:
        steps.append(held)
    return steps


def least_held(tried: Iterable[tuple[TrialConfig, TrialSummary]]) -> tuple[TrialConfig, float, bool] | None:
    """Of ``tried`` (configurations with their trials' summaries), the one that held least
    on a rank: it, that peak (MiB), and whether its trial ran to its end (else it was
    stopped there, over the limit, and would have held more). A trial that ran to its end
    reports its busiest rank's peak; one stopped on the host, its process tree's, shared
    here among its ranks. None when no trial says."""
    least: tuple[TrialConfig, float, bool] | None = None
    for cfg, result in tried:
        if result.rank_peak_mb is not None:
            peak, whole = result.rank_peak_mb, True
        elif cfg.device != Device.CUDA and result.peak_rss_mb:
            peak, whole = result.peak_rss_mb / cfg.nprocs, False
        else:
            continue
        if least is None or peak < least[1]:
            least = (cfg, peak, whole)
    return least


def nothing_fits(limit: MemoryLimit, tried: Iterable[tuple[TrialConfig, TrialSummary]]) -> str | None:
    """Where the user's configuration did not fit even holding less (``tried``: it and each
    step of its ``ladder`` measured, with their trials' summaries): the least it held, and
    what would fit. A rank's peak falls no faster than its micro-batch (weights, gradients
    and optimizer state stay), so the batch that fits is below the user's batch scaled by
    the limit over that peak. None when no trial reported what it held."""
    least = least_held(tried)
    if least is None:
        return None
    cfg, peak, whole = least
    held = f"{peak:,.0f} MiB a rank" + ("" if whole else " when it was stopped")
    text = f"the least it held was {held}, as {cfg.short()}"
    per_rank = limit.per_rank_mb(cfg)
    if per_rank is None:
        return f"{text}: give a smaller batch size in the model file, or more memory"
    step = cfg.nprocs * cfg.grad_accum  # the batch splits into this many micro-batches
    below = int(cfg.batch_size * per_rank / peak) // step * step
    text += f", over the {limit.source} ({per_rank:,.0f} MiB a rank). It would need "
    text += (f"a --memory-limit of {'more than' if not whole else 'at least'} {peak:,.0f} MiB a rank"
             if limit.user_mb is not None else f"{'more than ' if not whole else ''}{peak * cfg.nprocs:,.0f} MiB "
             "of this machine's memory")
    if below >= step:
        text += f", or a batch size of at most {below} in the model file (with those knobs)"
    return text


def holding_as(ref: TrialConfig, cand: TrialConfig) -> TrialConfig | None:
    """``ref`` with ``cand``'s memory knobs where it lacks them (sharding where it has the
    ranks): a numerics reference that ran out of memory without them. None when that
    changes nothing."""
    try:
        held = ref.replace(
            activation_checkpointing=ref.activation_checkpointing or cand.activation_checkpointing,
            grad_accum=max(ref.grad_accum, cand.grad_accum),
            sharding=cand.sharding if ref.nprocs > 1 and ref.sharding == Sharding.OFF else ref.sharding)
    except UsageError:
        return None
    return None if held == ref else held


# Bytes per activation element under each precision: a configuration in fp32 holds at
# least what the same one in bf16 holds.
_ACTIVATION_BYTES = {Precision.FP32: 4, Precision.TF32: 4, Precision.BF16: 2, Precision.FP16: 2}


def _holds_no_less(cfg: TrialConfig, than: TrialConfig) -> bool:
    """Whether ``cfg`` holds at least what ``than`` holds, but for the batch: the same
    otherwise, its activations no smaller (precision), its model no more pruned."""
    def rest(c: TrialConfig) -> tuple[Any, ...]:
        return tuple(v for v, name in zip(holds(c), _HOLDS) if name not in ("precision", "prune_ratio"))

    return (rest(cfg) == rest(than) and cfg.prune_ratio <= than.prune_ratio
            and _ACTIVATION_BYTES[Precision(cfg.precision)] >= _ACTIVATION_BYTES[Precision(than.precision)])


def oom_bound(failed: Iterable[TrialConfig], cfg: TrialConfig) -> int | None:
    """The smallest batch that ran out of memory (``failed``) holding no more than ``cfg``
    holds but for the batch, if any: ``cfg`` at that batch or above will too."""
    sizes = [f.batch_size for f in failed if _holds_no_less(cfg, f)]
    return min(sizes) if sizes else None


def bound(cfg: TrialConfig, *, ran_out: Iterable[TrialConfig],
          measured: Iterable[tuple[TrialConfig, TrialSummary]]) -> str | None:
    """Why ``cfg`` will not fit, from the trials so far: ``ran_out`` (the configurations
    that ran out of memory or over the limit) holds one of the same layout and memory
    knobs at its batch or a smaller one, or on a GPU two ``measured`` batches predict it
    (``predicted_over``); None when nothing says so."""
    smallest = oom_bound(ran_out, cfg)
    if smallest is not None and cfg.batch_size >= smallest:
        return (f"batch {smallest} ran out of memory with {cfg.nprocs} rank(s), {cfg.precision}, the {cfg.allocator} "
                "allocator and these memory knobs")
    return predicted_over(measured, cfg)


def predicted_over(measured: Iterable[tuple[TrialConfig, TrialSummary]], cfg: TrialConfig) -> str | None:
    """Why ``cfg`` would not fit in GPU memory, predicted from two measured batch sizes
    of the same kind of configuration (``measured``: configurations with their trials'
    summaries): a rank's peak grows linearly with its micro-batch (weights and optimizer
    state fixed, activations per sample), so two points give both parts. None when it
    fits, or when there is not enough to tell."""
    if cfg.device != Device.CUDA:
        return None

    def kind(c: TrialConfig) -> tuple[Any, ...]:  # what sets a rank's memory, but the batch
        return (c.nprocs, c.precision, c.compile, c.channels_last, c.prune_ratio,
                c.activation_checkpointing, c.sharding)

    points: dict[int, tuple[float, float]] = {}
    for other, result in measured:
        peak, total = result.cuda_peak_mb, result.cuda_total_mb
        if not peak or not total or kind(other) != kind(cfg):
            continue
        points[other.micro_batch] = (peak, total)
    if len(points) < 2:
        return None
    (b1, (p1, _)), (b2, (p2, total)) = sorted(points.items())[-2:]
    slope = (p2 - p1) / (b2 - b1)
    if slope <= 0 or cfg.micro_batch <= b2:
        return None
    predicted = p2 + slope * (cfg.micro_batch - b2)
    if predicted <= MEMORY_HEADROOM * total:
        return None
    scale = cfg.batch_size // cfg.micro_batch  # micro-batch to global batch
    return (f"batch {cfg.batch_size} would need about {predicted:,.0f} MiB per GPU of "
            f"{total:,.0f} MiB (from batches {b1 * scale} and {b2 * scale})")


def known_to_fit(limit: MemoryLimit, *, measured: Iterable[tuple[TrialConfig, TrialSummary]],
                 failed: Iterable[tuple[TrialConfig, str | None, str]]) -> Callable[[TrialConfig], bool]:
    """Whether a configuration is known to fit: any, where memory never bound in the search
    (nothing, the user's configuration included, ran out of memory or over the limit);
    else what the search measured within the limit, or one holding as much (the same
    batch and ``holds``)."""
    if not any(failure == Failure.OUT_OF_MEMORY for _, failure, _ in failed):
        return lambda cfg: True

    within = {(cfg.batch_size, holds(cfg)) for cfg, result in measured if not limit.over(cfg, result)}
    return lambda cfg: (cfg.batch_size, holds(cfg)) in within


def knobs_on(cfg: TrialConfig) -> tuple[str, ...]:
    """``cfg``'s memory knobs that are on, as the summary names them."""
    return tuple(name for name, on in (
        ("activation_checkpointing", cfg.activation_checkpointing),
        (f"grad_accum={cfg.grad_accum}", cfg.grad_accum > 1),
        (f"sharding={cfg.sharding}", cfg.sharding != Sharding.OFF)) if on)


def without_memory_knobs(cfg: TrialConfig) -> TrialConfig:
    return cfg.replace(activation_checkpointing=False, grad_accum=1, sharding=Sharding.OFF.value)


def fit_of(limit: MemoryLimit, *, chosen: TrialConfig, user: TrialConfig, reference: TrialConfig,
           user_result: TrialSummary, measured: Iterable[tuple[TrialConfig, TrialSummary]],
           failed: Iterable[tuple[TrialConfig, str | None, str]], alone_peak_mb: float | None = None) -> MemoryFit:
    """``chosen`` in memory, from the search's trials: ``measured`` (configuration, summary),
    ``failed`` (configuration, failure, message); ``user``, the user's own configuration
    (its trial's summary ``user_result``), ``reference`` what verification measured in
    its place (``user`` unless it did not fit); ``alone_peak_mb``: the emitted script's
    peak when run alone (the standalone check's), which is what the user will see."""
    measured = list(measured)
    results = dict(measured)

    ran_out = next((m for cfg, failure, m in failed if cfg == user and failure == Failure.OUT_OF_MEMORY), None)
    # where verification simplified or contrasted what the search measured: one holding as much
    alike = results.get(chosen) or next((r for c, r in measured if c.batch_size == chosen.batch_size
                                         and holds(c) == holds(chosen)), TrialSummary())
    fit = MemoryFit(limit_mb=limit.per_rank_mb(chosen), source=limit.source, alone=alone_peak_mb is not None,
                    chosen_peak_mb=alone_peak_mb if alone_peak_mb is not None else alike.rank_peak_mb,
                    baseline_peak_mb=user_result.rank_peak_mb,
                    memory_knobs=knobs_on(chosen), baseline_over=ran_out,
                    reference=reference.short() if reference != user else None)
    if not fit.memory_knobs:
        return fit
    plain = without_memory_knobs(chosen)
    ran_out_here = [(cfg, message) for cfg, failure, message in failed
                    if failure == Failure.OUT_OF_MEMORY and cfg.batch_size == chosen.batch_size
                    and not saves_memory(cfg)]
    # the winner without its memory knobs; else one that held what it would (the ablation
    # may have simplified its placement); else any at its batch
    nearest = sorted(ran_out_here, key=lambda item: (item[0] != plain, holds(item[0]) != holds(plain)))
    without = (None if not nearest else nearest[0][1] if nearest[0][0] == plain
               else f"{nearest[0][0].short()} {nearest[0][1]}")
    fitting = [(cfg, result) for cfg, result in measured
               if not saves_memory(cfg) and not limit.over(cfg, result)]
    best = max(fitting, key=lambda item: item[1].value or 0.0, default=None)
    chosen_rate = alike.value
    best_without = None
    if best is not None and chosen_rate and (best_rate := best[1].value):
        best_without = BestWithout(config=best[0].short(), samples_per_s=best_rate, chosen_samples_per_s=chosen_rate)
    return dataclasses.replace(fit, without=without, best_without=best_without)
