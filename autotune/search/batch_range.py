"""The global batch sizes the search tries, from the machine: how far throughput keeps
rising with the batch.

Before the search, one configuration (the launcher defaults, else the user's) is measured
at the user's batch and at twice it, four times... until throughput has not risen by
``FLAT`` over the best for ``PATIENCE`` steps, memory binds (a batch runs out of memory or
over the limit), or the batch reaches the most allowed (the data set, ``MAX_MULTIPLE``
times the user's). The search then tries a quarter of the user's batch up to twice the
fastest batch measured, no further than the largest that fit, and where memory did not
bind, no less than the default range (eight times the user's): a throughput that stopped
rising for the ramp's configuration may rise again where another knob pays off only at a
larger batch.

Optuna cannot change a knob's values within a study, so the ramp runs before the study's
first trial and its range is stored with the study (``StudyAttr.SPACE``); a resumed study
keeps the range it was searched over.

On a GPU the ramp also stops where device memory is nearly full: the next batch's peak,
extrapolated from the last two, would not fit (``MEMORY_FULL``). There it does not double one
step at a time (ten steps from a batch of 16 to 16,384): from the first two batches' peaks it
jumps to the largest batch that fits (``jump_to``; a step no longer than ``JUMP_STEP_S``),
then halves the gap to the knee, the smallest batch within ``FLAT`` of the fastest measured
(``Ramp.knee``, where the search starts). Its steps share one warm
process (the batch is not a process knob: ``trials.runner.process_key``), and under
--timeout it has ``TIMEOUT_SHARE`` of the search's share from its own start: what ran
before it (the probe, the model file's check) does not shorten it.

Without evaluate() nothing can check that a batch the user did not choose trains as well
(``verify.batch``): the batches searched then stay within the default range, eight times the
user's (``--batch-range`` sets other bounds). On a CPU the ramp goes one step beyond; on a
GPU, where the knee lies far beyond, it climbs to it: a faster batch it saw there is
named in the summary with the --batch-range that allows it (``verify.batch.describe``),
never chosen silently.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

from autotune.config import TrialConfig
from autotune.options import RunOptions
from autotune.runtime.knobs import Device
from autotune.schemas.typed import Record
from autotune.search.memory import MemoryLimit
from autotune.search.trial_summary import TrialSummary
from autotune.space import Space
from autotune.space.choices import default_batch_top
from autotune.trials.protocol import Failure, Status, StudyAttr
from autotune.trials.runner import TrialRunnerLike

if TYPE_CHECKING:
    import optuna

# A batch whose throughput is less than this much over the best measured so far has not
# risen: a trial's windows on a shared machine scatter by a few percent.
FLAT = 0.05
# Steps without a rise before the ramp stops: one slow measurement does not end it.
PATIENCE = 2
# The ramp stops at this many times the user's batch, rising or not.
MAX_MULTIPLE = 1024
# Under --timeout, the share of the search's time the ramp may start steps in, counted
# from the ramp's own start.
TIMEOUT_SHARE = 0.25
# A GPU's memory is nearly full where the next batch's peak would pass this share of it:
# what the allocator reserves beyond its peak, and a neighbour's context, take the rest.
MEMORY_FULL = 0.9
# On a GPU the ramp jumps no further than a batch whose step would take this long at the
# rate just measured: a larger batch runs no slower a sample, so this bounds a step's time.
JUMP_STEP_S = 5.0


def unchecked_top(user_batch: int, batch_range: tuple[int, int] | None) -> int:
    """The largest global batch searched without evaluate() to check it: the top of the
    user's --batch-range, else of the default range (``space.default_batch_top``)."""
    return batch_range[1] if batch_range is not None else default_batch_top(user_batch)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Ramp(Record):
    """What the ramp measured: ``config`` (short form) at each batch, ``rates`` as
    (batch, samples/s) in the order measured, why it ``stopped``, and the largest batch
    the search tries (``top``)."""

    config: str
    rates: tuple[tuple[int, float], ...]
    stopped: str
    top: int
    memory_bound: bool = False  # it stopped where a batch ran out of memory or over the limit
    # the batch the search starts from: where a ramp that jumped found throughput within FLAT
    # of its fastest; the fastest measured for one that doubled (None: an earlier run's record)
    knee: int | None = None
    # its first step's process, where fresh: its start until it measured, and its end (a
    # trial's wall time less its windows), and of that its setup before the first step; what
    # verification's fresh processes pay where every trial ran in a process started before
    start_s: float | None = None
    setup_s: float | None = None

    @property
    def fresh_start(self) -> tuple[float, float] | None:
        """A fresh process's start and setup as the first step paid them (None where it ran in
        a process started before): what verification's fresh processes pay where every trial of
        the search ran warm (``verify.deadline.Costs.from_trials``)."""
        return None if self.start_s is None else (self.start_s, self.setup_s or 0.0)

    @property
    def fastest(self) -> tuple[int, float] | None:
        return max(self.rates, key=lambda r: r[1]) if self.rates else None

    def faster_beyond(self, largest: int) -> tuple[int, float, float] | None:
        """The fastest batch measured beyond ``largest`` (the most allowed unchecked), when it
        ran at least ``FLAT`` faster than the fastest up to it: (batch, its rate, that rate)."""
        within = [r for b, r in self.rates if b <= largest]
        beyond = [(b, r) for b, r in self.rates if b > largest]
        if not within or not beyond:
            return None
        batch, rate = max(beyond, key=lambda r: r[1])
        return (batch, rate, max(within)) if rate >= max(within) * (1 + FLAT) else None


def ramp_of(study: optuna.Study) -> Ramp | None:
    """What the study's ramp measured, where it ran."""
    stored = study.user_attrs.get(StudyAttr.BATCH_RAMP)
    return Ramp.from_json(stored) if stored else None


@contextlib.contextmanager
def _short_windows(runner: TrialRunnerLike) -> Iterator[None]:
    """The runner measuring no longer than the default windows: the ramp finds a range, which
    the search then measures as the user asked (``--window``, ``--windows``)."""
    measurement = getattr(runner, "measurement", None)
    if measurement is None:  # a stand-in: nothing to shorten
        yield
        return
    runner.measurement = dataclasses.replace(  # type: ignore[attr-defined]
        measurement, window_s=min(measurement.window_s, RunOptions.window_s),
        windows=min(measurement.windows, RunOptions.windows))
    try:
        yield
    finally:
        runner.measurement = measurement  # type: ignore[attr-defined]


def ramp(runner: TrialRunnerLike, start: TrialConfig, *, most: int, limit: MemoryLimit | None,
         for_s: float | None = None, say: Callable[[str], None] = lambda text: None,
         ladder: Sequence[int] | None = None) -> Ramp:
    """Measure ``start`` at its batch, twice it, four times... (see the module's text), no
    batch over ``most``, in windows no longer than the defaults, and no step started
    ``for_s`` seconds after the first (its share of --timeout; None: no bound).
    ``ladder``: the batches to step through instead (those of a --batch-range from
    ``start``'s up)."""
    ends_at = None if for_s is None else time.time() + for_s
    steps = [b for b in (ladder if ladder is not None else doublings(start.batch_size, most)) if b <= most]
    end = (f"batch {steps[-1] if steps else most} is the top of the range searched" if ladder is not None
           else f"batch {steps[-1] * 2 if steps else most} is over the most tried ({most})")
    with _short_windows(runner):
        return _ramp(runner, start, steps=steps, end=end, limit=limit, ends_at=ends_at, say=say)


def doublings(first: int, most: int) -> list[int]:
    """``first``, twice it, four times... up to the first over ``most`` (named where the ramp stops)."""
    out = [first]
    while out[-1] <= most:
        out.append(out[-1] * 2)
    return out


class _Steps:
    """The ramp's measurements so far: each batch's rate, the peaks of those that ran, and
    why it stopped (a failure or a limit)."""

    def __init__(self, runner: TrialRunnerLike, start: TrialConfig, limit: MemoryLimit | None,
                 say: Callable[[str], None]) -> None:
        self.runner, self.start, self.limit, self.say = runner, start, limit, say
        self.rates: list[tuple[int, float]] = []
        self.peaks: list[tuple[int, TrialSummary]] = []
        self.failed: str | None = None
        self.memory_bound = False
        self.jumped = False  # it jumped toward the memory knee (a GPU), then refined
        self.start_s: float | None = None  # the first step's, where its process was fresh (Ramp.start_s)
        self.setup_s: float | None = None

    def by_batch(self) -> list[tuple[int, TrialSummary]]:
        """The peaks measured, by batch: the last two are the largest batches that ran."""
        return sorted(self.peaks, key=lambda p: p[0])

    def measure(self, batch: int) -> float | None:
        """``batch``'s rate; None where it failed or held more than allowed (``failed`` says why)."""
        cfg = self.start.replace(batch_size=batch)
        result = self.runner.run(cfg, name=f"batch-ramp-{batch}")
        over = (self.limit.over(cfg, TrialSummary.from_json(result.summary()))
                if self.limit is not None and result.status == Status.OK else None)
        if result.status != Status.OK or result.value is None or over:
            what = ("ran out of memory" if result.failure == Failure.OUT_OF_MEMORY
                    else over or f"failed ({result.describe_failure()})")
            self.failed = f"batch {batch} {what}"
            self.memory_bound = self.memory_bound or result.failure == Failure.OUT_OF_MEMORY or over is not None
            return None
        rate = float(result.value)
        summary = TrialSummary.from_json(result.summary())
        if not self.rates and not summary.warm and summary.phases.get("overhead_s") is not None:
            self.start_s = float(summary.phases["overhead_s"])
            self.setup_s = (float(summary.phases.get("start_import_s", 0.0))
                            + float(summary.phases.get("setup_s", 0.0)))
        self.rates.append((batch, rate))
        self.say(f"batch range: batch {batch} at {rate:,.1f} samples/s")
        self.peaks.append((batch, summary))
        return rate

    def rate(self, batch: int) -> float:
        return next(r for b, r in self.rates if b == batch)


def _ramp(runner: TrialRunnerLike, start: TrialConfig, *, steps: Sequence[int], end: str,
          limit: MemoryLimit | None, ends_at: float | None, say: Callable[[str], None]) -> Ramp:
    done = _Steps(runner, start, limit, say)
    best_rate, best_batch, flat = 0.0, start.batch_size, 0
    stopped = ""
    at = 0
    while at < len(steps):
        batch = steps[at]
        rate = done.measure(batch)
        if rate is None:
            stopped = done.failed or ""
            break
        if rate >= best_rate * (1 + FLAT):
            best_rate, best_batch, flat = rate, batch, 0
        else:
            flat += 1
        if flat >= PATIENCE:
            stopped = f"throughput stopped rising after batch {best_batch}"
            break
        if at + 1 == len(steps):
            stopped = end
            break
        if full := nearly_full(done.by_batch(), steps[at + 1]):
            stopped, done.memory_bound = full, True
            break
        if ends_at is not None and time.time() >= ends_at:
            stopped = f"its share of --timeout was spent at batch {batch}"
            break
        jump = jump_to(done.by_batch(), steps, at, rate=rate) if flat == 0 else None
        if jump is None:
            at += 1
            continue
        knee, stopped, reached = _jump(done, steps, at, jump, ends_at=ends_at, end=end)
        if reached is None:  # settled: the knee found, or the range's end, memory, or the clock
            best_batch = knee
            break
        # still rising where a step's time bounded the jump: the ramp goes on from there
        best_rate, best_batch, at = done.rate(steps[reached]), steps[reached], reached + 1
        if full := nearly_full(done.by_batch(), steps[at]):
            stopped, done.memory_bound = full, True
            break
        if ends_at is not None and time.time() >= ends_at:
            stopped = f"its share of --timeout was spent at batch {best_batch}"
            break
    fit = [b for b, _ in done.rates]
    top = min(max(fit), 2 * best_batch) if fit else start.batch_size
    fastest = max(done.rates, key=lambda r: r[1])[0] if done.rates else None
    return Ramp(config=start.short(), rates=tuple(done.rates), stopped=stopped, top=top,
                memory_bound=done.memory_bound, knee=best_batch if done.jumped else fastest,
                start_s=done.start_s, setup_s=done.setup_s)


def jump_to(peaks: Sequence[tuple[int, TrialSummary]], steps: Sequence[int], at: int, *, rate: float) -> int | None:
    """Where the ramp jumps from ``steps[at]`` (just measured at ``rate``), on a GPU: the
    index of the largest batch of ``steps`` whose device memory, extrapolated from the last
    two peaks, stays within ``MEMORY_FULL`` of the device (its memory knee), and whose step
    would take at most ``JUMP_STEP_S`` at ``rate`` (a larger batch only runs faster). None
    where that is no more than the next step, or the memory per sample is not known (a CPU)."""
    if len(peaks) < 2:
        return None
    (first, before), (batch, last) = peaks[-2], peaks[-1]
    if (last.cuda_peak_mb is None or before.cuda_peak_mb is None or not last.cuda_total_mb
            or first >= batch or rate <= 0):
        return None
    per_sample = max(0.0, (last.cuda_peak_mb - before.cuda_peak_mb) / (batch - first))
    room = MEMORY_FULL * last.cuda_total_mb - last.cuda_peak_mb
    fits = [i for i in range(at + 1, len(steps))
            if per_sample * (steps[i] - batch) <= room and steps[i] / rate <= JUMP_STEP_S]
    return fits[-1] if fits and fits[-1] > at + 1 else None


def _jump(done: _Steps, steps: Sequence[int], at: int, to: int, *, ends_at: float | None,
          end: str) -> tuple[int, str, int | None]:
    """From ``steps[at]``, measured, to ``steps[to]``, then halving the gap (in powers of two)
    to the knee: the smallest batch within ``FLAT`` of the fastest measured. Where the batch
    jumped to fails (its memory was misjudged), the jump goes half as far. Returns the knee,
    why the ramp stopped, and None; or, where the rate still rose at the batch jumped to and
    larger ones remain (the jump was bounded by a step's time), the index it reached, from
    which the ramp goes on."""
    done.jumped = True
    lo = at
    while True:
        if done.measure(steps[to]) is not None:
            break
        to = (lo + to) // 2
        if to <= lo:
            return steps[lo], f"{done.failed}: the ramp settled below it, at batch {steps[lo]}", None
    hi, why = to, ""
    while hi - lo > 1:
        if ends_at is not None and time.time() >= ends_at:
            why = f"its share of --timeout was spent between batch {steps[lo]} and {steps[hi]}"
            break
        mid = (lo + hi) // 2
        rate = done.measure(steps[mid])
        if rate is None:  # a batch below one that ran failed: nothing to refine on
            why = done.failed or ""
            break
        best = max(r for _, r in done.rates)
        if rate * (1 + FLAT) >= best:
            hi = mid
        else:
            lo = mid
    best = max(r for _, r in done.rates)
    knee = min(b for b, r in done.rates if r * (1 + FLAT) >= best)
    if knee == steps[to] and to + 1 < len(steps) and not why:
        return knee, "", to
    if not why:
        why = (end if knee == steps[to]
               else f"throughput stopped rising after batch {knee} (jumped to batch {steps[to]}, then halved "
                    "the gap)")
    return knee, why, None


def nearly_full(peaks: Sequence[tuple[int, TrialSummary]], following: int) -> str | None:
    """Why the ramp stops before batch ``following``: on a GPU, its peak, extrapolated
    from the last two batches' (``peaks``: batch and result, as measured), would pass
    ``MEMORY_FULL`` of the device's memory. None where it would fit, or is not known."""
    if len(peaks) < 2:  # one point cannot tell the weights' share from the batch's
        return None
    (first, before), (batch, last) = peaks[-2], peaks[-1]
    if last.cuda_peak_mb is None or before.cuda_peak_mb is None or not last.cuda_total_mb or first >= batch:
        return None
    per_sample = max(0.0, (last.cuda_peak_mb - before.cuda_peak_mb) / (batch - first))
    predicted = last.cuda_peak_mb + per_sample * (following - batch)
    if predicted <= MEMORY_FULL * last.cuda_total_mb:
        return None
    return (f"device memory is nearly full at batch {batch} ({last.cuda_peak_mb:,.0f} of "
            f"{last.cuda_total_mb:,.0f} MiB; batch {following} would need about {predicted:,.0f})")


def most_tried(user_batch: int, *, dataset_len: int | None, has_evaluate: bool, gpu: bool = False) -> int:
    """The largest batch the ramp may measure: the data set's length and ``MAX_MULTIPLE``
    times the user's batch; without evaluate() on a CPU one step beyond what may be
    emitted (on a GPU the knee, whatever may be emitted: what it saw there is advice)."""
    most = user_batch * MAX_MULTIPLE
    if not has_evaluate and not gpu:
        most = min(most, 2 * unchecked_top(user_batch, None))
    return min(most, dataset_len) if dataset_len else most


def settle(study: optuna.Study, space: Space, *, runner: TrialRunnerLike, start: TrialConfig,
           has_evaluate: bool, dataset_len: int | None, limit: MemoryLimit | None,
           batch_range: tuple[int, int] | None = None, for_s: float | None = None,
           say: Callable[[str], None] = lambda text: None,
           unjudged: str = "without evaluate(model) in the model file") -> tuple[Space, Ramp | None]:
    """The space with the batch sizes this study searches: the user's (``--fix batch_size``;
    ``batch_range``, --batch-range), those a resumed study was searched over, or the
    ramp's. The ramp is measured from ``start`` once per study and stored with it: a
    worker joining a shared study (under ``search.study.study_lock``) takes the one stored.
    Within a --batch-range it climbs the range's batches from the user's, to tell the
    search where throughput stops rising; the range stays the user's. Returns the space and
    the ramp (None where none was measured). ``for_s``: how long after its first step the
    ramp starts no more (None: no bound)."""
    stored = study.user_attrs.get(StudyAttr.BATCH_RAMP)
    found = Ramp.from_json(stored) if stored else None
    sizes = sorted(space.choices.get("batch_size", []))
    if len(sizes) < 2:
        return space, None
    if study.get_trials(deepcopy=False):  # resumed: its range, whatever the machine says now
        searched = (study.user_attrs.get(StudyAttr.SPACE) or {}).get("batch_size")
        # (the user's range is kept to be compared with it: search.study.settle_space)
        return (space.with_batches(searched) if searched and batch_range is None else space), found
    user = space.baseline.batch_size
    if found is None:
        if batch_range is not None:
            first = next((b for b in sizes if b >= user), sizes[-1])
            found = ramp(runner, start.replace(batch_size=first), most=sizes[-1], limit=limit,
                         for_s=for_s, say=say, ladder=[b for b in sizes if b >= first])
        else:
            most = most_tried(user, dataset_len=dataset_len, has_evaluate=has_evaluate,
                              gpu=start.device == Device.CUDA)
            found = ramp(runner, start, most=most, limit=limit, for_s=for_s, say=say)
        study.set_user_attr(StudyAttr.BATCH_RAMP, found.to_json())
    if batch_range is not None or not found.rates:
        # the user's range; or the default range, unmeasured: the ramp's first batch did not run
        return space, found
    top, why = found.top, found.stopped
    unchecked = unchecked_top(user, None)
    if top < unchecked and not found.memory_bound:
        # a throughput that stopped rising early may rise again where another knob (reduced
        # precision, more ranks) pays off only at a larger batch: the default range stays
        top, why = unchecked, f"{found.stopped}; the default range, eight times yours, is kept"
    if not has_evaluate and top > unchecked:
        top, why = unchecked, (f"no batch over {unchecked} is tried {unjudged}: "
                               "nothing could check that it trains as well as yours")
    if dataset_len and top > dataset_len:
        top, why = dataset_len, "larger than the dataset"
    space = space.with_batch_top(top, why=why)
    sizes = space.choices["batch_size"]
    say(f"batch sizes searched: {sizes[0]} to {sizes[-1]} ({why})")
    return space, found


def set_by(space: Space, *, batch_range: tuple[int, int] | None, pinned: int | None) -> str:
    """What set the batch sizes ``space`` searches, in words (``pinned``: --fix batch_size)."""
    if pinned is not None:
        return f"--fix batch_size={pinned}"
    if batch_range is not None:
        return f"--batch-range {batch_range[0]}-{batch_range[1]}"
    why = next((why for knob, why in space.excluded.items() if knob.startswith("batch_size>")), None)
    return why or "a quarter to eight times yours, the default range"
