"""What verification is asked: how far each stage may go, and what it knows of the run
(the planned run, what --timeout left, what fits in memory and on the GPUs)."""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

from autotune.config import TrialConfig
from autotune.options import RunOptions
from autotune.probes import Machine
from autotune.sections import VerifyOptions
from autotune.task.load import Task
from autotune.task.objective import PlannedRun, Pricing
from autotune.verify.deadline import MARGIN, Budget
from autotune.verify.decide import MOST_SEEDS
from autotune.verify.device_room import DeviceRoom
from autotune.verify.length import OwnTraining, gate_samples, own_training
from autotune.verify.overlap import ahead
from autotune.verify.reference import Measured


@dataclasses.dataclass(frozen=True)
class Settings:
    """How far each of verification's stages may go, and what it knows of the run."""

    rounds: int = RunOptions.rounds  # the most side-by-side rounds (sequential rules stop earlier)
    numerics_steps: int = 40
    # a scored gate training's samples (``autotune.verify.length``), against the user's own
    # training where it is known (``own``)
    quality_samples: int = 6400
    own: OwnTraining | None = None
    seeds: int = MOST_SEEDS  # the most seeds a gate's verdict trains (``autotune.verify.decide``)
    max_quality_drop: float | None = RunOptions.max_quality_drop
    script_timeout_s: float = 300.0  # one standalone run of a script, warm-up included
    pairs: int = RunOptions.pairs  # the most standalone pairs: each runs both scripts once
    pair_seconds: float = RunOptions.pair_seconds  # timed training per standalone run
    standalone_attempts: int = 2  # candidates whose scripts run alone, fastest first
    replacements: int = 2  # per kind (exact, reduced) for candidates the gates reject
    ablation: bool = True  # measure each knob's worth and drop those worth nothing
    path: bool = False  # and the path from the baseline, one knob added at a time
    pinned: frozenset[str] = frozenset()  # knobs the user fixed: never ablated or dropped
    pricing: Pricing | None = None  # the planned run (--train-steps, --epochs), if any
    budget: Budget | None = None  # what --timeout leaves, where it was given (autotune.verify.fit)
    # what the stages after the gates take as fitted (``fit.fit``): a gate's verdict trains
    # another seed only where what --timeout leaves holds it and them
    after_gates_s: float = 0.0
    # whether a configuration is known to fit in memory (search.memory.known_to_fit): the
    # ablation drops no knob without which it is not
    fits: Callable[[TrialConfig], bool] = lambda cfg: True
    # what verification may hold on the GPUs at once (autotune.verify.device_room)
    room: DeviceRoom | None = None
    cores: int | None = None  # the machine's usable cores: whether a run may set up beside another

    @classmethod
    def asked(cls, verify: VerifyOptions) -> Settings:
        """What the user asked of verification, before the run learns anything."""
        return cls(rounds=verify.rounds, pairs=verify.pairs, pair_seconds=verify.pair_seconds,
                   max_quality_drop=verify.max_quality_drop, path=verify.path, pinned=frozenset(verify.fixed))

    def lengthened(self, task: Task, plan: PlannedRun | None, measured: Measured) -> Settings:
        """These settings with the gates' scored trainings as long as ``autotune.verify.length``
        says for ``task`` (its own training, or ``plan``), at the slowest of the rates the
        search ``measured``."""
        own = own_training(task, plan)
        slowest = min((rate for _, rate in measured if rate), default=None)
        return dataclasses.replace(self, own=own, quality_samples=gate_samples(
            own, default=self.quality_samples, slowest=slowest))

    def on(self, machine: Machine, measured: Iterable[tuple[TrialConfig, float | None]]) -> Settings:
        """These settings on ``machine``: its usable cores, and the room on its GPUs for the
        configurations ``measured`` (each with its GPU peak in MiB, ``DeviceRoom.of``)."""
        return dataclasses.replace(self, cores=machine.cpu.usable_cores, room=DeviceRoom.of(machine, measured))

    def affords(self, seconds: float) -> bool:
        """Whether a gate's verdict may train another seed of ``seconds``: always without
        --timeout (``seeds`` bounds it); under it, where what is left, less the fitting's
        margin, holds it and the stages after the gates."""
        return self.budget is None or self.budget.left() / MARGIN >= seconds + self.after_gates_s

    def ahead(self, configs: Sequence[TrialConfig]) -> int:
        """How many standalone runs of ``configs`` set up while another one measures
        (``autotune.verify.overlap``)."""
        return ahead(cores=self.cores, room=self.room, configs=configs)[0]
