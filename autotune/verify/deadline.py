"""``--timeout`` bounds the whole run: how it is shared, how much is left, and what
verification's stages cost on this machine, estimated from what this run measured.

The search gets ``SEARCH_SHARE`` of the time (it starts no trial after that; the one
measuring then finishes), less where verification at its least (``fit.least``) would not
fit in the rest (``verify.reserve.leave_for_verification``); verification gets what is left, and
its stages are fitted to it (``autotune.verify.fit``). Costs are estimated from the search's trials, whose wall time
the runner splits into phases: the part that is not the measured windows (a fresh
interpreter, imports, the model file's setup, warm-up, the end) is what every fresh
process of verification pays again (each configuration held side by side, each standalone
run of a script); a gate's run that the runner hands to a warm process pays what the
search's warm trials paid.
"""
from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Collection, Iterable, Sequence

from autotune.config import TrialConfig
from autotune.search.outcome import SearchOutcome
from autotune.search.trial_summary import TrialSummary
from autotune.verify.device_room import DeviceRoom
from autotune.verify.reference import Measured, fastest_alike, measured_rates
from autotune.verify.side_by_side import Visits

# A compile read from the on-disk cache, as a share of the cold one the search measured:
# the kernels are cached, Dynamo's trace and the CUDA graphs' capture are not.
FROM_CACHE_SHARE = 0.25
# How much slower than the fastest configuration measured at its batch a gate's training
# of a configuration the search never measured (an fp32 reference beside bf16, eager beside
# compiled) is priced: bf16's tensor cores run matrix products a few times fp32's rate, and
# a step is rarely all matrix products.
UNMEASURED_SLOWER = 4.0



# The costs are estimated from a few trials of the search, and verification under
# --timeout took 6-10% longer than they predicted: plans fit what is left less a tenth,
# and the search leaves a tenth more than the least (autotune.verify.reserve).
MARGIN = 1.1

@dataclasses.dataclass(frozen=True)
class Costs:
    """Seconds, as this run measured them. ``start_s``: a fresh process from its start until
    it measures, and its end (a trial's wall time less its measured windows): what each
    configuration held side by side and each standalone run pays; ``trial_start_s``: the
    same over the search's trials that ran in a process an earlier one started (all of them
    where none did): what a gate's run handed to a warm process pays (``fit.gates_cost``
    prices the others at ``start_s``); ``window_s``: one side-by-side window; ``sample_s``:
    one training step's time per sample at the baseline's rate (the candidates are faster: an upper
    bound); ``evaluate_s``: one evaluate(model) call, as the model file's check timed it
    (``Task.evaluate_s``), which a scored training of the gates makes several times;
    ``imports_s``: the imports (torch, torch._dynamo) the search's processes found done,
    forked from a warm interpreter, and a standalone run, a fresh interpreter running the
    emitted script, pays itself (``script_start_s``)."""

    start_s: float
    window_s: float
    sample_s: float
    trial_start_s: float | None = None  # None: as ``start_s``
    setup_s: float = 0.0  # of ``start_s``, what comes before the first step: a run setting up beside another
    # what each process of a compiled configuration pays on top: its compile read from the
    # run's on-disk cache (Dynamo's trace, the CUDA graphs' capture), a share of a cold one
    recompile_s: float = 0.0
    evaluate_s: float = 0.0
    imports_s: float = 0.0
    # the configurations the search measured, with their samples/s: a gate's training of one
    # of them, or of one that computes the same, trains at its rate (``rate_of``)
    rates: Measured = ()

    @classmethod
    def from_trials(cls, results: Iterable[TrialSummary], *, window_s: float,
                    baseline_rate: float, evaluate_s: float = 0.0, rates: Measured = (),
                    fresh_start: tuple[float, float] | None = None, compiled: Collection[int] = ()) -> Costs:
        """From the search's trials' results (``TrialResult.summary``), and the seconds of one
        evaluate() call (``Task.evaluate_s``). ``fresh_start``: a fresh process's start and its
        setup as the batch ramp's first step paid them (``Ramp.start_s``), where every trial ran
        in a process an earlier one started. ``compiled``: the indices of the results whose
        configuration compiles: their one-time cost, a cold compile, is no process's start
        (``recompile_s`` prices what each later process of theirs pays)."""
        results = list(results)
        overheads = [(float(r.phases["overhead_s"]) - (float(r.one_time_s or 0.0) if i in compiled else 0.0), r.warm)
                     for i, r in enumerate(results) if r.phases.get("overhead_s") is not None]
        fresh = [s for s, warm in overheads if not warm]
        warm = [s for s, was_warm in overheads if was_warm]
        # the interpreter's start and imports, then the model file's setup: before the first step
        setups = [float(r.phases.get("start_import_s", 0.0)) + float(r.phases.get("setup_s", 0.0))
                  for r in results if not r.warm and "overhead_s" in r.phases]
        if not fresh and fresh_start is not None:
            fresh, setups = [fresh_start[0]], [fresh_start[1]]
        fresh = fresh or [s for s, _ in overheads]
        start = statistics.median(fresh) if fresh else 0.0
        cold = max((float(r.one_time_s) for r in results if r.one_time_s), default=0.0)
        imported = [float(r.preimported_s) for r in results if r.preimported_s]
        return cls(start_s=start, window_s=window_s, recompile_s=FROM_CACHE_SHARE * cold,
                   imports_s=statistics.median(imported) if imported else 0.0,
                   sample_s=1.0 / baseline_rate if baseline_rate > 0 else 0.0,
                   trial_start_s=statistics.median(warm or [s for s, _ in overheads]) if overheads else None,
                   setup_s=min(start, statistics.median(setups)) if setups else 0.0, evaluate_s=evaluate_s,
                   rates=tuple(rates))

    @classmethod
    def of_search(cls, outcome: SearchOutcome, *, window_s: float, evaluate_s: float,
                  fresh_start: tuple[float, float] | None) -> Costs:
        """From the search's outcome (which has measured its baseline): its trials, their
        rates, which of them compile (``from_trials``)."""
        assert outcome.baseline is not None
        return cls.from_trials([c.result for c in outcome.ranked], window_s=window_s,
                               baseline_rate=outcome.baseline.measured.samples_per_s, evaluate_s=evaluate_s,
                               rates=measured_rates(outcome), fresh_start=fresh_start,
                               compiled={i for i, c in enumerate(outcome.ranked) if c.config.compile != "off"})

    def rate_of(self, cfg: TrialConfig) -> float | None:
        """The samples/s a training of ``cfg`` runs at: as the search measured it, else as the
        fastest it measured that computes the same (``reference.fastest_alike``: a reference on
        that one's feeding knobs); None where it measured neither."""
        exact = [rate for measured, rate in self.rates if measured == cfg]
        if exact:
            return max(exact)
        alike = fastest_alike(cfg, self.rates)
        if alike is not None:
            return alike[1]
        # an fp32 reference at a batch the search measured only in reduced precision or
        # compiled (the search stops before its fp32 twin where the reference is priced at the
        # baseline's rate): a share of that batch's fastest, never below the baseline's rate
        same = [rate for measured, rate in self.rates
                if (measured.batch_size, measured.nprocs, measured.device) == (cfg.batch_size, cfg.nprocs, cfg.device)]
        if not same:
            return None
        return max(max(same) / UNMEASURED_SLOWER, 1.0 / self.sample_s if self.sample_s else 0.0)

    def process(self, *, samples: float = 0.0, fresh: bool = False, evaluations: int = 0,
                rate: float | None = None) -> float:
        """One trial that trains ``samples`` samples (a numerics trajectory, a quality run)
        and calls evaluate() ``evaluations`` times; ``fresh``: in a process of its own (no
        warm one has its process knobs); ``rate``: its samples/s where known (``rate_of``),
        else the baseline's."""
        start = self.start_s if fresh or self.trial_start_s is None else self.trial_start_s
        return start + (samples / rate if rate else samples * self.sample_s) + evaluations * self.evaluate_s

    def side_by_side(self, configs: Sequence[TrialConfig], rounds: int, room: DeviceRoom | None = None) -> float:
        """``configs`` measured side by side for ``rounds`` rounds (``side_by_side.Visits``):
        those held started once, the others once a visit, and every round one window each."""
        plan = Visits.of(configs, rounds, room)
        fresh = len(configs) - len(plan.held)
        held = len(plan.held) * self.start_s
        if plan.held and room is not None and room.capacity_mb is not None:
            # on GPUs those held set up at once, and warm up one at a time (LiveTrial.wait_ready)
            held = self.setup_s + len(plan.held) * (self.start_s - self.setup_s)
        return held + fresh * plan.visits * self.start_s + plan.cap * len(configs) * self.window_s

    @property
    def script_start_s(self) -> float:
        """A standalone run's start and end: a fresh interpreter's, the imports included."""
        return self.start_s + self.imports_s

    @property
    def script_setup_s(self) -> float:
        """Of ``script_start_s``, what comes before its first step."""
        return self.setup_s + self.imports_s

    def pairs(self, pairs: int, seconds: float, *, ahead: int = 0) -> float:
        """``pairs`` pairs of standalone runs of ``seconds`` of timed training each; with
        ``ahead`` runs setting up while one trains, each run but the first pays only its
        warm-up and training, or its share of a setup that takes longer."""
        if ahead:
            return self.script_setup_s + pairs * 2 * self.ahead_run(seconds, ahead)
        return pairs * 2 * (self.script_start_s + seconds)

    def ahead_run(self, seconds: float, ahead: int) -> float:
        """One standalone run of ``seconds`` with ``ahead`` runs setting up at once."""
        return max(self.script_start_s - self.script_setup_s + seconds, self.script_setup_s / ahead)


@dataclasses.dataclass(frozen=True)
class Budget:
    """What ``--timeout`` left the run: it ends at ``ends_at`` (``clock``'s time);
    ``costs`` estimate what a stage takes."""

    timeout_s: float
    ends_at: float
    costs: Costs
    # time.time looked up at each call, so that a test's clock (a simulated node's) applies
    clock: Callable[[], float] = lambda: time.time()

    def left(self) -> float:
        return self.ends_at - self.clock()

    @property
    def why(self) -> str:
        return f"to fit --timeout {self.timeout_s:g}"
