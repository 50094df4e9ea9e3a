"""What a run is asked to do, and every default of it, defined once.

The CLI (``autotune.commands``), the Python API (``autotune.api``), the trial runner and
the measurement read their defaults from ``RunOptions``' fields, so a default changed here
changes everywhere, help texts included. Cheap to import: the commands parse their
options without loading the run's machinery.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from autotune.errors import UsageError
from autotune.runtime.knobs import LrScaling, Precision

# Where --storage is read from when not given: a URL with a password stays out of the
# shell's history and the process list.
STORAGE_ENV = "AUTOTUNE_STORAGE"
# The search's share of --timeout at most (less where verification's least needs more);
# verification gets the rest (autotune.verify.deadline).
# Verification at its smallest still starts a dozen or so processes (the gates'
# trajectories, the side-by-side session, the standalone pairs), about as many as the
# search's first trials: most of a short budget goes to it.
SEARCH_SHARE = 0.3


_UNITS = {"k": 2**-10, "m": 1.0, "g": 2**10, "t": 2**20}


def parse_size(text: str, *, flag: str = "--memory-limit") -> float:
    """``"6GiB"``, ``"6G"``, ``"6000MiB"``, ``"512M"`` -> MiB (binary units; a bare number is
    refused, since MiB and GiB differ by a thousand)."""
    body = str(text).strip().lower().removesuffix("ib").removesuffix("b")
    unit = body[-1:] if body[-1:] in _UNITS else ""
    try:
        value = float(body[: len(body) - len(unit)])
    except ValueError:
        value = -1.0
    if not unit or value <= 0:
        raise UsageError(f"{flag} {text!r}: expected a size with its unit, e.g. {flag} 6GiB "
                         f"or {flag} 800MiB")
    return value * _UNITS[unit]


def parse_batch_range(text: str) -> tuple[int, int]:
    """``"16-1024"`` -> (16, 1024): the global batch sizes the search may try."""
    low, sep, high = str(text).strip().partition("-")
    try:
        bounds = (int(low), int(high)) if sep else None
    except ValueError:
        bounds = None
    if bounds is None or not 1 <= bounds[0] <= bounds[1]:
        raise UsageError(f"--batch-range {text!r}: expected LOW-HIGH, two whole numbers with 1 <= LOW <= HIGH, "
                         "e.g. --batch-range 16-1024")
    return bounds


def parse_scale_lr(text: str) -> str:
    """``"linear"`` -> ``LrScaling.LINEAR``'s value; anything else is refused with the choices."""
    try:
        return LrScaling(str(text).strip().lower()).value
    except ValueError:
        choices = ", ".join(r.value for r in LrScaling)
        raise UsageError(f"--scale-lr {text!r}: expected one of {choices}, e.g. --scale-lr linear "
                         "(the learning rate times the tuned batch over yours)") from None


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What a run is asked to do; the CLI's options, by name."""

    trials: int = 20
    # --timeout bounds the whole run: the search gets SEARCH_SHARE of it, verification's
    # stages are fitted to the rest (verify.fit). None: no bound.
    timeout_s: float | None = None
    fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    exact: bool = False
    top: int = 1
    window_s: float = 1.0
    windows: int = 3
    trial_timeout_s: float = 300.0
    hang_timeout_s: float = 30.0
    # The most side-by-side rounds and standalone pairs: each stops earlier once settled
    # (verify.sequential).
    rounds: int = 10
    pairs: int = 6
    # Timed training per standalone run, after its warm-up: DataLoader workers ramp up
    # over the first seconds, and shorter runs printed speedups below what an independent
    # check of longer runs measured (BENCHMARKS.md, "Standalone runs of 8 s").
    pair_seconds: float = 8.0
    max_quality_drop: float | None = None
    # --scale-lr: how the learning rate follows a batch size unlike the user's (LrScaling);
    # "none" leaves it as the model file sets it.
    scale_lr: str = LrScaling.NONE.value
    # --memory-limit: the most memory one rank may hold, in MiB (host memory on CPU, device
    # memory on CUDA); None: what the machine has, less a margin (search.memory).
    memory_limit_mb: float | None = None
    # --batch-range: the global batch sizes the search may try (LOW, HIGH); None: the range
    # measured on the machine (search.batch_range).
    batch_range: tuple[int, int] | None = None
    # The ablation's path from the baseline, one knob added at a time: as many processes
    # again as the leave-one-out that decides what is emitted, and it decides nothing, so it
    # is measured only on request.
    path: bool = False
    # Configurations with the same process knobs measured one after another in one process
    # (autotune.trials.runner.process_key); False: each in a fresh process.
    warm_trials: bool = True
    # After the outputs are written, one window of the emitted script under torch.profiler:
    # where its step goes (best_config.json's step_profile); False: --no-profile.
    profile: bool = True
    # The run the user plans (autotune.search.objective.Plan): steps at their own batch
    # size, or passes over the data set; at most one. None of them: the search ranks by
    # steady throughput, as for a run of endless length.
    train_steps: int | None = None
    epochs: int | None = None
    # A shared study (search.shared): its database URL (a secret: never printed, see
    # search.study.shown_url), its name, how often a worker's running trial says it is
    # alive, and how long a worker waits for another one's verification.
    storage: str | None = dataclasses.field(default=None, repr=False)
    study: str | None = None
    heartbeat_s: int = 10
    verify_wait_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.pairs < 2:
            raise UsageError(f"--pairs {self.pairs}: at least 2 (the speedup's interval needs two pairs)")
        if self.heartbeat_s < 1:
            raise UsageError("--heartbeat must be at least 1 second")
        for flag, count in (("--train-steps", self.train_steps), ("--epochs", self.epochs)):
            if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
                raise UsageError(f"{flag} {count!r}: expected a positive whole number, e.g. {flag} 1000")
        if self.train_steps is not None and self.epochs is not None:
            raise UsageError("--train-steps and --epochs both describe the run you plan: give one of them")
        if self.memory_limit_mb is not None and not self.memory_limit_mb > 0:
            raise UsageError(f"--memory-limit {self.memory_limit_mb!r}: expected a positive size in MiB")
        if self.batch_range is not None:
            parse_batch_range("-".join(map(str, self.batch_range)))  # the same checks, the same message
            if "batch_size" in self.fixed:
                raise UsageError(f"--batch-range and --fix batch_size={self.fixed['batch_size']} both set the "
                                 "batch size: give one of them")
        # the vocabulary's value (tune() may pass an LrScaling, or "Linear")
        object.__setattr__(self, "scale_lr", parse_scale_lr(self.scale_lr))
        if self.max_quality_drop is not None and self.max_quality_drop < 0:
            raise UsageError("--max-quality-drop must be 0 or more")
        if self.exact:
            for knob, exact_value in (("precision", Precision.FP32), ("prune_ratio", 0.0)):
                if self.fixed.get(knob, exact_value) != exact_value:
                    raise UsageError(f"--exact keeps {knob}={exact_value}, but --fix "
                                     f"{knob}={self.fixed[knob]} asks otherwise: drop one of them")
