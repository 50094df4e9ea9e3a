"""Where the search goes besides the sampler, queued on the study: the start (the user's
configuration, the machine's heuristic starts, one at the batch range's fastest batch,
each reduced precision) and the end of the budget (the refinement on the best so far:
``search.climb``'s steps and the batch stage; then the late knobs). The trial's
``StudyAttr.ROLE`` tells them apart."""
from __future__ import annotations

import itertools

from optuna.trial import TrialState

from autotune.config import KnobValue, Layout, TrialConfig
from autotune.runtime.knobs import CompileMode, Device
from autotune.search import climb, late
from autotune.search.ledger import Ledger
from autotune.search.pruner import config_of
from autotune.trials.protocol import Role, StudyAttr


class Stages:
    """What ``ledger``'s study queues; ``trials``: the budget; ``heuristics``: the start
    points besides the user's configuration; ``fastest_batch``: the batch range's fastest
    (``search.batch_range``)."""

    def __init__(self, ledger: Ledger, *, trials: int, heuristics: list[TrialConfig] | None = None,
                 fastest_batch: int | None = None) -> None:
        self.ledger, self.study, self.space = ledger, ledger.study, ledger.space
        self.trials, self.heuristics, self.fastest_batch = trials, heuristics or [], fastest_batch

    @property
    def _first_start(self) -> TrialConfig:
        """The first start point: the launcher defaults (or the user's configuration)."""
        return self.heuristics[0] if self.heuristics else self.space.baseline

    def _ramped(self) -> int | None:
        """The batch range's fastest batch where the first start can take it (searched,
        another than its own, split by its ranks); else None."""
        start, ramped = self._first_start, self.fastest_batch
        if (ramped is None or ramped == start.batch_size or ramped % start.nprocs
                or ramped not in self.space.choices.get("batch_size", [])):
            return None
        return ramped

    def _on_gpus(self) -> bool:
        return self._first_start.device == Device.CUDA

    def _precision_starts(self) -> list[TrialConfig]:
        """Each reduced precision the space offers, at the user's batch size and at the
        batch range's fastest (else the largest up to four times it), on the launcher
        defaults (or the baseline); on GPUs, once the batch range found a larger batch
        faster, at that batch alone.

        Left to the sampler, a precision can be tried once at a small batch size, where
        its fixed cost per step (casts, scaling) outweighs what it saves, lose, and never
        be tried again, though at a larger batch it would win: its cost per step falls
        with the batch, so each is measured early at two sizes and the sampler learns
        from both. On a GPU the larger batch is where the step fills the device; the
        user's batch in every precision would spend a third of a short search on steps
        that leave it idle."""
        start = self._first_start
        sizes = sorted(self.space.choices.get("batch_size", []))
        larger = [b for b in sizes if start.batch_size < b <= 4 * start.batch_size
                  and b % start.nprocs == 0]
        ramped = self._ramped()
        if ramped is not None:
            larger = [ramped]
        batches = [start.batch_size, *larger[-1:]]
        if ramped is not None and ramped > start.batch_size and self._on_gpus():
            batches = [ramped]
        return [start.replace(precision=p, batch_size=b)
                for p in self.space.choices.get("precision", [])[1:] for b in batches]

    def _starts(self) -> list[TrialConfig]:
        """The machine's start points; on GPUs at the batch range's fastest batch, where it
        found one faster than the user's: an expert's recipe at a batch that leaves the
        device idle is not where one starts."""
        ramped = self._ramped()
        if ramped is None or ramped < self._first_start.batch_size or not self._on_gpus():
            return self.heuristics
        return list(dict.fromkeys(c.replace(batch_size=ramped) for c in self.heuristics))

    def _ramped_start(self) -> list[TrialConfig]:
        """The first start at the batch range's fastest batch, where that is another than its
        own: the ramp measured it outside the study, and a sampler that never learns of it
        may not come near it (a --batch-range opened to 128 times the user's batch holds
        ten batch sizes). On GPUs the starts are moved there instead (``_starts``)."""
        ramped = self._ramped()
        if ramped is None or self._starts() is not self.heuristics:
            return []
        return [self._first_start.replace(batch_size=ramped)]

    def enqueue_start(self) -> None:
        if self.study.get_trials(deepcopy=False):
            return
        starts = ([(Role.BASELINE, self.space.baseline)] + [(Role.HEURISTIC, c) for c in self._starts()]
                  + [(Role.HEURISTIC, c) for c in self._ramped_start()]
                  + [(Role.PRECISION, c) for c in self._precision_starts()])
        queued: set[TrialConfig] = set()
        for role, cfg in starts:
            if cfg in queued:  # the expert's precision among the precision starts
                continue
            queued.add(cfg)
            params = {}
            for name, values in self.space.choices.items():
                if name == "layout" and cfg.layout not in values:  # default threads, not searched
                    threads = cfg.threads or max((layout.threads or 1 for layout in self.space.layouts
                                                  if layout.nprocs == 1), default=None)
                    value = str(Layout(cfg.nprocs, threads))
                elif name == "layout":
                    value = cfg.layout
                else:
                    value = getattr(cfg, name)
                if value in values:
                    params[name] = value
            self.study.enqueue_trial(params, user_attrs={StudyAttr.ROLE: role})

    def _batch_stage(self, best: TrialConfig) -> list[dict[str, KnobValue]]:
        """Groups taken in turns: the best configuration in the other precision kind (exact
        against reduced), and that kind's own best at other batch sizes, so that the
        fallback verification keeps for a reduced-precision winner is refined too; the
        best of the other process kind (several ranks against one) at larger sizes; and
        the best configuration at other batch sizes, last: the climb (``_refinement``)
        moves it along its batch while that wins.

        The other process kind is for a noisy search that settles on one kind early and
        never samples the other at the sizes where it wins: ranks split the batch, so
        their cost per step falls most as the batch grows."""
        groups = []
        other_precision = self.ledger.best_config(exact=not best.exact)
        if other_precision is not None:
            # the winner's other knobs (workers, memory format, layout) in the other
            # precision kind first: they tend to carry over, and its own best has had
            # fewer samples
            moved = best.replace(precision=other_precision.precision,
                                 prune_ratio=other_precision.prune_ratio)
            groups.append([self.space.params_of(moved)])
            groups.append(self.space.batch_variants(other_precision))
        other = self.ledger.best_config(several_ranks=best.nprocs == 1)
        if other is not None:
            groups.append([params for params in self.space.batch_variants(other)
                           if int(params["batch_size"] or 0) > other.batch_size])
        groups.append(self.space.batch_variants(best))
        stage: list[dict[str, KnobValue]] = []
        for turn in itertools.zip_longest(*groups):
            stage += [params for params in turn if params is not None and params not in stage]
        # one measured before costs no trial and tells nothing new: its slot goes to TPE
        return [params for params in stage
                if self.ledger.previous(self.space.config_from_params(params)) is None]

    def _late_stage(self, best: TrialConfig) -> list[dict[str, KnobValue]]:
        """Each late knob's values on the best configuration; the first one on the best of
        the other precision kind. On GPUs the compile modes likeliest to win go first
        (``late.ordered``), and once one is shown slower the rest are skipped (``_measure``)."""
        stage = late.ordered(self.space.late_variants(best), best.device, filled=self._fills(best))
        other = self.ledger.best_config(exact=not best.exact)
        if other is not None:
            stage += [p for p in late.ordered(self.space.late_variants(other), other.device,
                                              filled=self._fills(other))[:1]
                      if p not in stage]
        return stage

    def compile_ahead(self) -> dict[str, KnobValue] | None:
        """The late stage's first compile on the best so far (``_late_stage``), to be measured
        now, under --timeout (the caller's to say): where the best runs uncompiled on a GPU at
        a batch that fills it (``_fills``), and no trial compiled, queued or measured, yet.
        Queued by the trials left (``enqueue_refinements``), the compiles come after the
        starts and the steered trials, by when a short --timeout no longer holds one; a compile
        is the knob worth most on a GPU, paid once and read from the run's cache by every later
        process, and the best at the ramp's knee is near where the search ends. None otherwise."""
        best = self.ledger.best_config()
        if (best is None or best.device != Device.CUDA or best.compile != CompileMode.OFF
                or not self._fills(best)):
            return None
        for t in self.study.get_trials(deepcopy=False):
            cfg = config_of(t)
            queued = (t.system_attrs.get("fixed_params") or {}).get("compile")
            if (t.user_attrs.get(StudyAttr.ROLE) == Role.LATE or (cfg is not None and cfg.compile != CompileMode.OFF)
                    or queued not in (None, CompileMode.OFF)):
                return None
        return next((p for p in late.ordered(self.space.late_variants(best), best.device, filled=True)
                     if p.get("compile") not in (None, CompileMode.OFF)), None)

    def _fills(self, cfg: TrialConfig) -> bool:
        """Whether ``cfg``'s batch fills its GPU: at or past the batch ramp's knee, where
        throughput stopped rising with the batch."""
        return self.fastest_batch is not None and cfg.batch_size >= self.fastest_batch

    def _refinement(self, best: TrialConfig, *, turn: int) -> tuple[Role, dict[str, KnobValue]] | None:
        """The refinement's next trial, taken in turns from two kinds (either where the
        other has none): ``best`` one value beyond an edge of what was tried
        (``climb.steps``), which climbs while each step wins; and the next of the batch
        stage (``_batch_stage``). None once neither has one."""
        tried = [c for t in self.study.get_trials(deepcopy=False) if (c := config_of(t)) is not None]
        beyond: list[tuple[Role, dict[str, KnobValue]]] = []
        for knob, cfg in climb.steps(best, space=self.space, tried=tried):
            try:
                params = self.space.params_of(cfg)
            except ValueError:  # a knob outside the space: not searchable
                continue
            if self.ledger.memory_bound(cfg) is None:
                beyond.append((Role.BATCH if knob == "batch_size" else Role.EDGE, params))
        stage = [(Role.BATCH, params) for params in self._batch_stage(best)]
        kinds = (beyond, stage) if turn % 2 == 0 else (stage, beyond)
        return next((pick for kind in kinds for pick in kind), None)

    def enqueue_refinements(self) -> None:
        """Spend the end of the budget on the best configurations so far: first the
        refinement (``_refinement``, at most a third of the budget: the sampler keeps the
        rest), one trial at a time, each on the best as it stands then; then, on the best
        after those, each late knob (``_late_stage``). Each stage starts when nothing else
        is queued (a retry, the start) and the budget left equals what the stages still to
        come need; the refinement's slots are stored with the study
        (``StudyAttr.BATCH_ENQUEUED``)."""
        if (self.study.user_attrs.get(StudyAttr.LATE_ENQUEUED)
                or self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,))):
            return
        cfg = self.ledger.best_config()
        if cfg is None:
            return
        left = self.trials - len(self.ledger.measured()) - len(self.ledger.running())
        late = self._late_stage(cfg)
        slots = self.study.user_attrs.get(StudyAttr.BATCH_ENQUEUED)
        if slots is None:
            planned = max(3, self.trials // 3) if self._refinement(cfg, turn=0) is not None else 0
            if left > planned + len(late):
                return
            # the best may have changed since the last trial: the late stage must still fit
            slots = max(0, min(planned, left - len(late)))
            self.study.set_user_attr(StudyAttr.BATCH_ENQUEUED, slots)
        if slots is not True:  # True: an older study queued its batch stage at once
            taken = sum(1 for t in self.study.get_trials(deepcopy=False)
                        if t.user_attrs.get(StudyAttr.ROLE) in (Role.BATCH, Role.EDGE))
            if taken < slots and (pick := self._refinement(cfg, turn=taken)) is not None:
                role, params = pick
                self.study.enqueue_trial(params, user_attrs={StudyAttr.ROLE: role})
                return
        if not late or left > len(late):  # late_enqueued: returned above
            return
        for params in late:
            self.study.enqueue_trial(params, user_attrs={StudyAttr.ROLE: Role.LATE})
        self.study.set_user_attr(StudyAttr.LATE_ENQUEUED, True)
