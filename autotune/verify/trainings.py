"""The gates' short trainings: one per configuration, shared by the checks that read it.

The numerics check compares a candidate's first losses with its fp32 reference's; the
quality check compares evaluate() after an identical short training. Both start from the
same seed, weights and global batches, so one training serves both: the run records the
losses of every step (averaged over ranks) and, where the model file has evaluate(), its
score at the end and at points along the way (``evaluation_steps``). A configuration that
computes what another already did (they differ only in placement knobs, ``work_key``) from
the same seed is not trained again: the simplified configuration of the ablation, a
candidate that shares a reference with another. The scored fp32 trainings are kept in the
output folder (``autotune.verify.reference.KeptReferences``): a re-run and ``autotune verify``
read them instead of training them again.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from autotune.config import TrialConfig
from autotune.search.trial_summary import TrialSummary
from autotune.trials.protocol import Status
from autotune.trials.runner import TrialResult, TrialRunnerLike
from autotune.trials.spec import LossGuard
from autotune.verify.decide import MOST_SEEDS
from autotune.verify.length import OwnTraining
from autotune.verify.reference import KeptReferences, Measured, trained_fast, work_key


def slowest_rate(measured: Sequence[tuple[TrialConfig, TrialSummary]]) -> float | None:
    """The slowest samples/s the search measured (None where it measured none): a gate's
    training may run that slow, for its reference is not a configuration the search ran
    (fp32, eager, default threads, the candidate's batch)."""
    return min((result.value for _, result in measured if result.value), default=None)


def metrics(results: Mapping[str, TrialResult]) -> tuple[dict[str, float], str | None]:
    """evaluate()'s score of each scored training, by role; or the first role whose training
    failed or has no score, and why."""
    scores: dict[str, float] = {}
    for role, res in results.items():
        if res.status != Status.OK or res.metric is None:
            return scores, f"{role}: {res.describe_failure()}"
        scores[role] = res.metric
    return scores, None


def trained_samples(result: TrialResult, batch_size: int, *, asked: int) -> int:
    """The samples a scored training took: ``asked``, or more where it trained on past them by
    a step or more (a plain loop's, run to its next print of its metric: ``trials.printed``)."""
    ran = len(result.losses) * batch_size
    return ran if ran >= asked + batch_size else asked


# Where along a scored training evaluate() scores it, as shares of its steps, besides the
# end: the quality check compares trainings at matched points past the start-up, where one
# score at the end would be one draw of fp32's noise. Step 0 (before any training) says
# what the training gained.
EVALUATION_SHARES = (0.5, 0.75)


def evaluation_steps(steps: int) -> tuple[int, ...]:
    """The steps before which a scored training of ``steps`` steps is scored, besides its end."""
    return (0, *sorted({round(share * steps) for share in EVALUATION_SHARES} - {0, steps}))


def training_steps(cfg: TrialConfig, *, evaluate: bool, numerics_steps: int, quality_samples: int) -> int:
    """How long a gate's training of ``cfg`` is: the numerics check's steps, or, where
    evaluate() scores it, the quality check's samples at ``cfg``'s batch size if longer."""
    if not evaluate:
        return numerics_steps
    return max(numerics_steps, -(-quality_samples // cfg.batch_size))


@dataclasses.dataclass
class Trainings:
    """The short trainings of one verification, by ``work_key`` and seed. ``evaluate``:
    whether the model file has evaluate(). A training asked for ``scored`` (a candidate
    whose knobs trade quality, and its references) runs ``training_steps`` with evaluate()
    along the way and at the end; any other runs the numerics check's steps alone, and is
    run again, scored, only if a scored one is asked of the same computation later.
    ``kept``: where scored fp32 trainings are kept between runs (None: nowhere)."""

    runner: TrialRunnerLike
    evaluate: bool
    numerics_steps: int = 40
    quality_samples: int = 6400
    runs: dict[tuple[str, int], TrialResult] = dataclasses.field(default_factory=dict)
    scored: set[tuple[str, int]] = dataclasses.field(default_factory=set)
    # the batch check's trainings, by work_key, steps and seed: over a number of samples fixed
    # by the user's batch, not by the numerics check's steps
    over_samples: dict[tuple[str, int, int], TrialResult] = dataclasses.field(default_factory=dict)
    ran: int = 0  # trainings run: numbers their folders
    # the slowest samples/s the search measured: a training gets the time its steps would
    # take that slow, where the runner's limit is less
    slowest: float | None = None
    kept: KeptReferences | None = None
    reused: int = 0  # scored trainings read from ``kept`` instead of run
    # the seconds of one evaluate() call, as the model file's check timed it (Task.evaluate_s)
    evaluate_s: float = 0.0
    # the configurations the search measured, with their samples/s: a reference trains on
    # the feeding knobs of the fastest that computes what it computes (``reference``)
    measured: Measured = ()
    # the user's own training, where known: what ``quality_samples`` is a length of
    own: OwnTraining | None = None
    seeds: int = MOST_SEEDS  # the most seeds a gate's verdict trains
    # what scores a training, for the verdicts' words: the model file's evaluate(), a Trainer's
    # metric, the metric a plain loop prints (``Task.scored_by``)
    scorer: str = "evaluate()"
    # its ranks train on another data order than one process (``Task.ranks_reorder``): the
    # quality check, not the numerics check, judges a configuration of several ranks
    ranks_reorder: bool = False
    greater_is_better: bool = True  # the scorer's own sense: its scores are shown in it

    def shown(self, score: float) -> float:
        """A score as the user's metric reads it (a loss positive again)."""
        return score if self.greater_is_better else -score
    # whether --timeout's reserve holds another seed of so many seconds (``Settings.affords``)
    affords: Callable[[float], bool] = lambda seconds: True

    def reference(self, cfg: TrialConfig) -> TrialConfig:
        """Where the reference ``cfg`` trains: on the feeding knobs of the fastest configuration
        the search measured that computes what it computes (``reference.trained_fast``)."""
        return trained_fast(cfg, self.measured)

    def limit_s(self, cfg: TrialConfig, steps: int, *, evaluations: int = 0) -> float | None:
        """The time a training of ``steps`` steps of ``cfg`` that calls evaluate()
        ``evaluations`` times may take where the runner's trial limit would end it first:
        three times the steps at the slowest rate the search measured and the evaluations at
        ``evaluate_s``, and two minutes to start; None (the runner's own) where that is less
        or neither is known."""
        own = getattr(self.runner, "timeout_s", None)
        scoring = evaluations * self.evaluate_s
        if not (self.slowest or scoring) or own is None:
            return None
        training = 3.0 * steps * cfg.batch_size / self.slowest if self.slowest else 0.0
        needed = training + 3.0 * scoring + 120.0
        return needed if needed > own else None

    def steps(self, cfg: TrialConfig, *, scored: bool = True) -> int:
        return training_steps(cfg, evaluate=scored and self.evaluate, numerics_steps=self.numerics_steps,
                              quality_samples=self.quality_samples)

    def samples(self, cfg: TrialConfig) -> int:
        """The samples of ``cfg``'s scored training: the batch check's budget, at the user's batch."""
        return self.steps(cfg) * cfg.batch_size

    @staticmethod
    def steps_for(cfg: TrialConfig, samples: int) -> int:
        return max(1, round(samples / cfg.batch_size))

    def for_samples(self, cfg: TrialConfig, role: str, *, samples: int, seed: int = 0) -> TrialResult:
        """``cfg`` trained from ``seed`` over ``samples`` samples (to the nearest whole step) and
        scored at its end: the scored training ``of`` runs where it has as many steps."""
        steps = self.steps_for(cfg, samples)
        key = work_key(cfg)
        if (key, seed) in self.scored and self.steps(cfg) == steps:
            return self.runs[key, seed]
        if (key, steps, seed) not in self.over_samples:
            name = f"verify-gates-{self.ran}-{role}" + (f"-seed{seed}" if seed else "")
            self.ran += 1
            self.over_samples[key, steps, seed] = self.runner.run(
                cfg, name=name, quality_steps=steps, seed_offset=seed,  # scored at its end
                timeout_s=self.limit_s(cfg, steps, evaluations=1))
        return self.over_samples[key, steps, seed]

    def of(self, cfg: TrialConfig, role: str, *, scored: bool = False, seed: int = 0,
           guard: LossGuard | None = None) -> TrialResult:
        """``cfg``'s training from ``seed`` (``role`` names its folder: reference or candidate),
        ended early where its losses stray past ``guard``."""
        key = (work_key(cfg), seed)
        scored = scored and self.evaluate
        if key in self.runs and (not scored or key in self.scored):
            return self.runs[key]
        steps = self.steps(cfg, scored=scored)
        if scored:
            points = evaluation_steps(steps)
            seeded = int(getattr(self.runner, "seed", 0)) + seed  # what the kept trainings are found by
            kept = (self.kept.read(cfg, seed=seeded, steps=steps, evaluate_at=points)
                    if self.kept and cfg.exact else None)
            if kept is not None:
                self.reused += 1
                result = kept
            else:
                result = self.runner.run(cfg, name=self._name(role, seed), quality_steps=steps,
                                         timeout_s=self.limit_s(cfg, steps, evaluations=len(points) + 1),
                                         evaluate_at=points,
                                         seed_offset=seed, guard=guard)
                if self.kept is not None and cfg.exact:
                    self.kept.write(cfg, result, seed=seeded, steps=steps, evaluate_at=points)
            self.scored.add(key)
        else:
            result = self.runner.run(cfg, name=self._name(role, seed), trajectory_steps=steps,
                                     timeout_s=self.limit_s(cfg, steps), seed_offset=seed, guard=guard)
        self.runs[key] = result
        return result

    def _name(self, role: str, seed: int) -> str:
        name = f"verify-gates-{self.ran}-{role}" + (f"-seed{seed}" if seed else "")
        self.ran += 1
        return name
