"""The late stage's compiled trials on GPUs: which compile mode is tried first, and when the
rest are not tried at all.

A compiled trial on a GPU costs tens of seconds cold, each in a fresh process
(``trials.runner.process_key``), and the late stage compiles up to four configurations. On
GPUs the mode likeliest to win goes first; once one compiled mode is shown slower than the
uncompiled best, the stage's other compiled trials are skipped: they compile the same model,
and the budget's trials go back to the sampler. A compiled trial's time limit follows what
compiling in its mode was measured to cost (``trial_limit_s``), and under --timeout it starts
only where its compile ends within what the run has left once verification at its least is
kept (``too_late``): a compile is paid once, and the run's later processes read it from
the on-disk cache.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import optuna
from optuna.trial import TrialState

from autotune.config import KnobValue, TrialConfig
from autotune.runtime.knobs import CompileMode, Device
from autotune.search.pruner import config_of
from autotune.search.trial_summary import TrialSummary
from autotune.trials import limits
from autotune.trials.protocol import Role, StudyAttr

# On GPUs, below the batch where the step fills the device: CUDA graphs first
# (reduce-overhead: one launch replays a step's many small kernels, whose launch overhead
# dominates there), then the default mode; the autotuning modes, the slowest to compile by
# far, last.
CUDA_COMPILE_ORDER = (CompileMode.REDUCE_OVERHEAD, CompileMode.DEFAULT,
                      CompileMode.MAX_AUTOTUNE_NO_CUDAGRAPHS, CompileMode.MAX_AUTOTUNE)
# At or past that batch (the batch ramp's knee, where throughput stopped rising) the launches
# are hidden behind the kernels, and CUDA graphs save next to nothing (ResNet-50: +44% at batch
# 1, ~0% from 8): what a compile brings there is fused kernels, the default mode's first, then
# autotuned ones (max-autotune-no-cudagraphs); reduce-overhead and max-autotune, which capture
# graphs, last.
CUDA_FILLED_ORDER = (CompileMode.DEFAULT, CompileMode.MAX_AUTOTUNE_NO_CUDAGRAPHS,
                     CompileMode.REDUCE_OVERHEAD, CompileMode.MAX_AUTOTUNE)
# A compile on a GPU in a mode the study has not measured yet, cold: tens of seconds for a
# small model on an H100 (30-45 s for the README example on an H200); the default mode, which
# captures no CUDA graphs and benchmarks no kernels, the quickest. The autotuning modes take
# longer (AUTOTUNE_FACTOR where another mode was measured).
COLD_COMPILE_S = 40.0
COLD_DEFAULT_S = 30.0
# An autotuning mode's compile against another's, where only another was measured: it
# benchmarks kernel choices besides compiling them.
AUTOTUNE_FACTOR = 2.5
# A compiled trial is shown slower when its value is under the uncompiled best's by more
# than this, or than either trial's spread of windows (IQR over median) where that is wider.
NOISE = 0.05


def ordered(variants: Sequence[Mapping[str, KnobValue]], device: Device, *,
            filled: bool = False) -> list[dict[str, KnobValue]]:
    """The late stage's params (``Space.late_variants``), on GPUs in ``CUDA_COMPILE_ORDER``,
    or ``CUDA_FILLED_ORDER`` where the configuration's batch fills the device (``filled``)."""
    out = [dict(p) for p in variants]
    if device != Device.CUDA:
        return out
    rank = {m.value: i for i, m in enumerate(CUDA_FILLED_ORDER if filled else CUDA_COMPILE_ORDER)}
    return sorted(out, key=lambda p: rank.get(str(p.get("compile")), len(rank)))


def spread(result: TrialSummary) -> float:
    """A trial's spread between its windows, as a share of its value (0 where unknown)."""
    value, iqr = result.value, result.iqr
    return iqr / value if value and iqr else 0.0


def _spread(t: optuna.trial.FrozenTrial) -> float:
    return spread(TrialSummary.from_json(t.user_attrs.get(StudyAttr.RESULT) or {}))


def compile_lost(trials: Iterable[optuna.trial.FrozenTrial]) -> str | None:
    """Why the late stage's compiled trials still queued are not measured: one compiled
    late trial was pruned, or measured slower than the best uncompiled trial of its kind
    (exact or reduced precision, as the pruner compares) by more than noise; None while
    none was."""
    done = [(t, c) for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            and (c := config_of(t)) is not None]
    for t, cfg in done:
        if t.user_attrs.get(StudyAttr.ROLE) != Role.LATE or cfg.compile == CompileMode.OFF:
            continue
        if t.state == TrialState.PRUNED:
            return f"compile={cfg.compile} was pruned: clearly slower than the best uncompiled trial"
        plain = [u for u, c in done if c.compile == CompileMode.OFF and c.exact == cfg.exact
                 and u.state == TrialState.COMPLETE and u.value is not None]
        if t.value is None or not plain:
            continue
        best = max(plain, key=lambda u: u.value or 0.0)
        assert best.value is not None
        margin = max(NOISE, _spread(t), _spread(best))
        if t.value < best.value * (1 - margin):
            return (f"compile={cfg.compile} measured {t.value:,.0f} samples/s, under the uncompiled "
                    f"best's {best.value:,.0f} by more than noise ({margin:.0%})")
    return None


def _compiles(trials: Iterable[optuna.trial.FrozenTrial], cfg: TrialConfig) -> list[tuple[float, float]]:
    """(one-time cost, wall time) of each trial the study measured in ``cfg``'s compile
    mode on its device."""
    return [(float(r["one_time_s"]), float(r.get("wall_s") or 0.0)) for t in trials
            if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
            and (c := config_of(t)) is not None and (c.compile, c.device) == (cfg.compile, cfg.device)
            and (r := t.user_attrs.get(StudyAttr.RESULT) or {}).get("one_time_s")]


def trial_limit_s(trials: Iterable[optuna.trial.FrozenTrial], cfg: TrialConfig, *,
                  least_s: float) -> float | None:
    """The limit of a trial of ``cfg`` where it compiles (``limits.run_limit_s``): from the
    slowest one-time cost the study measured in its compile mode on its device, and the
    rest of that trial's time; None (the runner's ``least_s``) for an uncompiled one, or
    before that mode was measured."""
    if cfg.compile == CompileMode.OFF:
        return None
    return limits.slowest_limit_s(least_s, _compiles(trials, cfg))


def priced_on_the_run(cfg: TrialConfig) -> bool:
    """Whether a trial of ``cfg`` is priced against what is left of the whole run rather
    than of the search's share: a compiled one on a GPU, whose compile is paid once and
    read from the run's cache by every later process."""
    return cfg.compile != CompileMode.OFF and cfg.device == Device.CUDA


def compile_estimate_s(trials: Iterable[optuna.trial.FrozenTrial], cfg: TrialConfig) -> float:
    """What compiling ``cfg`` cold is expected to cost: the slowest the study measured in
    its mode on its device; else the first compile it measured in another mode (times
    ``AUTOTUNE_FACTOR`` for an autotuning mode after one that is not); else ``COLD_DEFAULT_S``
    for the default mode, ``COLD_COMPILE_S`` for another."""
    trials = list(trials)
    same = [once for once, _ in _compiles(trials, cfg)]
    if same:
        return max(same)
    done = sorted((t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)
                   and (c := config_of(t)) is not None and c.device == cfg.device and c.compile != CompileMode.OFF
                   and (t.user_attrs.get(StudyAttr.RESULT) or {}).get("one_time_s")), key=lambda t: t.number)
    if not done:
        return COLD_DEFAULT_S if cfg.compile == CompileMode.DEFAULT else COLD_COMPILE_S
    first = done[0]
    once = float(first.user_attrs[StudyAttr.RESULT]["one_time_s"])
    measured_mode = str((config_of(first) or cfg).compile)
    if str(cfg.compile).startswith("max-autotune") and not measured_mode.startswith("max-autotune"):
        once *= AUTOTUNE_FACTOR
    return once


def too_late(trials: Iterable[optuna.trial.FrozenTrial], cfg: TrialConfig, *, left_s: float) -> str | None:
    """Why a compiled trial of ``cfg`` on a GPU does not start with ``left_s`` seconds left
    (of the whole run less verification at its least: ``priced_on_the_run``): its compile
    (``compile_estimate_s``) would not end within them, and the trial would overrun into the
    time verification was left. None where it fits, or on a CPU, where eager and compiled
    trials cost alike enough for the longest trial so far to bound the next."""
    if not priced_on_the_run(cfg):
        return None
    need = compile_estimate_s(trials, cfg)
    if need <= left_s:
        return None
    return (f"compile={cfg.compile} would compile for about {need:.0f} s, past what --timeout leaves "
            f"before verification ({max(0.0, left_s):.0f} s left)")
