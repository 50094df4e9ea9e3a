"""GPU landscapes, read and replayed: a workload's design of configurations as a GPU measured
them (``bench/gpu_landscape.py`` writes one; tests/fixtures/landscapes/ keeps them), and a
simulated one-GPU node (``LandscapeNode``) that answers trials from one, so the search's
policy is tested on CPU CI against a known best.

The file (JSON; ``bench/gpu_landscape.py`` is its writer, this module its reader):

- its header: ``format`` (1), ``workload`` (the model file, relative to the repository),
  ``recorded`` (false: shaped by hand, ``bench/shape_landscape.py``; then ``source`` says
  after what), ``device``, ``device_type`` ("cuda" or "cpu"), ``memory_mb`` (the device's),
  ``driver``, ``torch``, ``cuda``, ``host_cores``, ``commit``, ``date``, ``user_batch``,
  ``budget_s``, ``took_s``, ``window_s``, ``windows``, and ``costs``: ``setup_s`` (a fresh
  process's setup), ``warmup_s``, ``compile_s`` (each compile mode's cold compile) and
  ``recompile_s`` (one from the on-disk cache; null where not measured);
- ``points``: each a ``config`` (``TrialConfig.to_dict()``; a knob it leaves out takes
  TrialConfig's default on the header's device), ``phase`` (how the design got to it), ``warm``
  and ``setup_s`` (its process's setup: about 0 in a warm one), and either ``samples_per_s``
  (median of its windows), ``spread`` (their IQR over the median), ``peak_mb`` (device memory
  at its peak; host memory on a CPU), ``compile_s`` (its one-time cost where compiled, else
  null) and, where profiled, ``shares`` (where its step went); or a ``failure``
  ("out_of_memory", ...) with its ``message``.

A configuration runs as its nearest point (``Landscape.nearest``): of the points not out of
memory, the one agreeing with it on the most categorical knobs (``CATEGORICAL``: the workers
by their power of two, ``workers_bucket``; a precision never measured as its kin, fp16 as
bf16), ties to the closest batch in log2, then the closest worker count, then the first
recorded. Its rate (``Landscape.rate``) is that point's, corrected for each knob (the batch
too) the two differ in by what the landscape recorded of that knob: the ratio of the nearest
recorded pair of points that differ in it (from the point's value to the configuration's) and
in nothing else (a pair may move several such knobs at once). Without the corrections, a knob combination the design never ran
would borrow the rate of a far one: a bf16 run with workers, compiled and with cuDNN's
benchmark at batch 4096 answers for the same without workers, which on a data-bound workload
runs ten times slower. A configuration out of memory (``Landscape.out_of_memory``) gets its
nearest point with the failure instead.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import statistics
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autotune.config import TrialConfig
from autotune.runtime.step_profile import StepProfile
from autotune.trials.result import TrialResult

from simulated_gpu_node import GiB, SimCosts, SimulatedGpuNode

FIXTURES = Path(__file__).parent / "fixtures" / "landscapes"
FORMAT = 1
OUT_OF_MEMORY = "out_of_memory"
# The knobs nearest() compares, the workers by bucket (workers_bucket).
CATEGORICAL = ("precision", "compile", "num_workers", "cudnn_benchmark", "channels_last", "optimizer_step",
               "expandable_segments", "pin_memory")
BATCH = "batch_size"
KEYS = (*CATEGORICAL, BATCH)  # what a correction may move
# What the reader needs of a file's header and of its costs (the rest is for people).
HEADER_KEYS = ("workload", "recorded", "source", "device", "memory_mb", "user_batch", "costs", "points")
COST_KEYS = ("setup_s", "compile_s")
# A precision the landscape never measured runs as its kin (fp16 as bf16: half precision on
# the same tensor cores).
PRECISION_KIN = {"fp16": "bf16", "bf16": "fp16", "tf32": "fp32", "fp32": "tf32"}
# How many knobs a correcting pair may differ in beside those it corrects (ones the point and
# the configuration agree on): none. A pair that moves another knob too carries that knob's
# effect, which may be the larger: one that pins memory and adds workers is mostly the workers.
MOST_BESIDE = 0


class LandscapeError(ValueError):
    """A landscape file that cannot be read: the message names the file and the key."""


def workers_bucket(workers: int) -> int:
    """DataLoader workers by their power of two: 0 alone, then 1, 2, 3-5, 6-11, 12-22, 23+..."""
    return 0 if workers <= 0 else 1 + round(math.log2(workers))


def categorical(cfg: TrialConfig) -> tuple[Any, ...]:
    """``cfg``'s values of the CATEGORICAL knobs, its workers by bucket."""
    values = [getattr(cfg, k) for k in CATEGORICAL]
    return tuple(workers_bucket(int(v or 0)) if k == "num_workers" else getattr(v, "value", v)
                 for k, v in zip(CATEGORICAL, values))


@dataclasses.dataclass(frozen=True)
class Point:
    """One recorded configuration and what it ran at (or the failure it met)."""

    index: int
    config: TrialConfig
    samples_per_s: float | None
    spread: float
    peak_mb: float | None
    warm: bool
    setup_s: float
    compile_s: float | None = None
    failure: str | None = None
    phase: str = ""
    shares: Mapping[str, float] | None = None
    knobs: tuple[Any, ...] = ()  # its CATEGORICAL values (categorical()), as nearest() compares them

    def __post_init__(self) -> None:
        object.__setattr__(self, "knobs", categorical(self.config))

    @property
    def vector(self) -> tuple[Any, ...]:
        """Its categorical knobs and its batch (in the order of KEYS)."""
        return (*self.knobs, self.batch)

    @property
    def batch(self) -> int:
        return self.config.batch_size

    @property
    def ran(self) -> bool:
        return self.failure is None and self.samples_per_s is not None

    @property
    def precision(self) -> str:
        return str(self.config.precision.value)


def _need(where: str, data: Mapping[str, Any], key: str, kinds: type | tuple[type, ...], *,
          optional: bool = False) -> Any:
    if key not in data:
        raise LandscapeError(f"{where}: no key {key!r}")
    value = data[key]
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, kinds):  # a bool is an int to isinstance
        raise LandscapeError(f"{where}: key {key!r} is {value!r}, not {getattr(kinds, '__name__', kinds)}")
    return value


def _point(path: Path, i: int, data: Any, base: TrialConfig) -> Point:
    where = f"{path}: points[{i}]"
    if not isinstance(data, Mapping):
        raise LandscapeError(f"{where}: not an object")
    knobs = _need(where, data, "config", dict)
    if BATCH not in knobs:
        raise LandscapeError(f"{where}: key 'config' has no 'batch_size'")
    known = {f.name for f in dataclasses.fields(TrialConfig)}
    try:
        config = base.replace(**{k: v for k, v in knobs.items() if k in known})
    except (ValueError, TypeError) as exc:
        raise LandscapeError(f"{where}: key 'config' is not a configuration: {exc}") from None
    failure = data.get("failure")
    warm = bool(data.get("warm", False))
    setup_s = float(data.get("setup_s") or 0.0)
    if failure is not None:
        return Point(i, config, None, 0.0, data.get("peak_mb"), warm, setup_s, failure=str(failure),
                     phase=str(data.get("phase", "")))
    rate = float(_need(where, data, "samples_per_s", (int, float)))
    if rate <= 0:
        raise LandscapeError(f"{where}: key 'samples_per_s' is {rate}: a point that ran has a rate above 0")
    spread = float(_need(where, data, "spread", (int, float)))
    peak = _need(where, data, "peak_mb", (int, float), optional=True)
    compile_s = data.get("compile_s")
    shares = data.get("shares")
    return Point(i, config, rate, spread, None if peak is None else float(peak), warm, setup_s,
                 compile_s=None if compile_s is None else float(compile_s), phase=str(data.get("phase", "")),
                 shares=dict(shares) if shares else None)


@dataclasses.dataclass(frozen=True)
class Replayed:
    """What a configuration runs as: its nearest ``point``, the ``rate`` it runs at (the point's,
    corrected by the ``pairs`` (to, from) for the knobs it differs in; None: out of memory)."""

    point: Point
    rate: float | None
    pairs: tuple[tuple[Point, Point], ...] = ()


@dataclasses.dataclass(frozen=True)
class Landscape:
    path: Path
    header: Mapping[str, Any]  # the file less its points
    points: tuple[Point, ...]
    _replayed: dict[TrialConfig, Replayed] = dataclasses.field(default_factory=dict, compare=False, repr=False)
    # the pairs of points that ran, each (to, from, the indices of KEYS they differ in, to's and from's values)
    _pairs: list[tuple[Point, Point, tuple[int, ...], tuple[Any, ...], tuple[Any, ...]]] = dataclasses.field(
        default_factory=list, compare=False, repr=False)

    @classmethod
    def load(cls, path: str | Path) -> Landscape:
        path = Path(path)
        try:
            doc = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise LandscapeError(f"{path}: not a landscape file: {exc}") from None
        if not isinstance(doc, dict):
            raise LandscapeError(f"{path}: not a JSON object")
        for key in HEADER_KEYS:
            if key not in doc:
                raise LandscapeError(f"{path}: no key {key!r}")
        _need(str(path), doc, "memory_mb", (int, float))
        _need(str(path), doc, "user_batch", int)
        costs = _need(str(path), doc, "costs", dict)
        for key in COST_KEYS:
            if key not in costs:
                raise LandscapeError(f"{path}: costs: no key {key!r}")
        if not isinstance(costs["compile_s"], dict):
            raise LandscapeError(f"{path}: costs: key 'compile_s' is not an object of compile modes")
        if not isinstance(doc["points"], list) or not doc["points"]:
            raise LandscapeError(f"{path}: key 'points' holds no points")
        device = str(doc.get("device_type", "cuda"))
        base = TrialConfig(batch_size=1, device=device, backend="nccl" if device == "cuda" else "gloo")
        points = tuple(_point(path, i, p, base) for i, p in enumerate(doc["points"]))
        if not any(p.ran for p in points):
            raise LandscapeError(f"{path}: key 'points': none of them ran")
        return cls(path, {k: v for k, v in doc.items() if k != "points"}, points)

    # --- the header ---------------------------------------------------------------------------

    @property
    def workload(self) -> str:
        return str(self.header["workload"])

    @property
    def user_batch(self) -> int:
        return int(self.header["user_batch"])

    @property
    def memory_mb(self) -> float:
        return float(self.header["memory_mb"])

    @property
    def recorded(self) -> bool:
        return bool(self.header["recorded"])

    @property
    def setup_s(self) -> float:
        """A fresh process's setup: the costs' figure, else the median of the fresh points'."""
        given = self.header["costs"].get("setup_s")
        if given is not None:
            return float(given)
        fresh = [p.setup_s for p in self.points if not p.warm and p.ran]
        return statistics.median(fresh) if fresh else SimCosts.start_s

    def compile_s(self, mode: str) -> float | None:
        """A cold compile in ``mode``: the median of the points compiled so, else the costs' figure."""
        seen = [p.compile_s for p in self.points
                if p.ran and p.compile_s is not None and p.config.compile.value == mode]
        if seen:
            return statistics.median(seen)
        given = self.header["costs"]["compile_s"].get(mode)
        return None if given is None else float(given)

    # --- configurations --------------------------------------------------------------------------

    @property
    def ran(self) -> tuple[Point, ...]:
        return tuple(p for p in self.points if p.ran)

    def precision_of(self, cfg: TrialConfig) -> str:
        """``cfg``'s precision, or its kin where the landscape measured none of it."""
        mine = str(cfg.precision.value)
        measured = {p.precision for p in self.points}
        if mine in measured:
            return mine
        return PRECISION_KIN.get(mine, mine) if PRECISION_KIN.get(mine) in measured else mine

    def values_of(self, cfg: TrialConfig) -> tuple[Any, ...]:
        """``cfg``'s categorical knobs (its precision as the landscape reads it) and its batch
        (in the order of KEYS)."""
        return (self.precision_of(cfg), *categorical(cfg)[1:], cfg.batch_size)

    def order(self, cfg: TrialConfig, values: tuple[Any, ...]) -> Callable[[Point], tuple[float, ...]]:
        """How near a point is to ``cfg`` (of ``values``), for min(): knobs apart, batch apart
        in log2, workers apart in log2(1 + workers), then the first recorded."""
        mine = values[:len(CATEGORICAL)]

        def key(p: Point) -> tuple[float, ...]:
            return (sum(1 for a, b in zip(mine, p.knobs) if a != b), abs(math.log2(cfg.batch_size / p.batch)),
                    abs(math.log2(1 + cfg.num_workers) - math.log2(1 + p.config.num_workers)), p.index)
        return key

    def nearest(self, cfg: TrialConfig) -> Point:
        """The point ``cfg`` runs as (the module's docstring says which); where it runs out of
        memory (``out_of_memory``), that point with the failure "out_of_memory"."""
        return self.replay(cfg).point

    def replay(self, cfg: TrialConfig) -> Replayed:
        """``cfg``'s nearest point and the rate it runs at, the point's corrected."""
        found = self._replayed.get(cfg)
        if found is not None:
            return found
        values = self.values_of(cfg)
        point = min((p for p in self.points if p.failure != OUT_OF_MEMORY), key=self.order(cfg, values))
        if self.out_of_memory(cfg):
            found = Replayed(dataclasses.replace(point, samples_per_s=None, failure=OUT_OF_MEMORY), None)
        elif not point.ran:
            found = Replayed(point, None)
        else:
            pairs = self.corrections(cfg, values, point)
            rate = point.samples_per_s or 0.0
            for to, of in pairs:
                rate *= (to.samples_per_s or 0.0) / (of.samples_per_s or 1.0)
            found = Replayed(point, rate, tuple(pairs))
        self._replayed[cfg] = found
        return found

    def corrections(self, cfg: TrialConfig, values: tuple[Any, ...], point: Point) -> list[tuple[Point, Point]]:
        """The recorded pairs (to, from) that move ``point`` toward ``cfg``: for the knobs the two
        differ in, greedily, the pair that differs in the fewest knobs beside those it moves (at
        most MOST_BESIDE, and none that ``point`` and ``cfg`` differ in), then moves the most,
        then is nearest to ``cfg``; each moves its knobs from ``point``'s values to ``cfg``'s."""
        if not self._pairs:
            ran = self.ran
            for a in ran:
                for b in ran:
                    differ = tuple(i for i, (x, y) in enumerate(zip(a.vector, b.vector)) if x != y)
                    if a is not b and len(differ) <= len(KEYS) // 2:
                        self._pairs.append((a, b, differ, a.vector, b.vector))
        have = point.vector
        apart = {i for i, v in enumerate(values) if have[i] != v}
        differing = frozenset(apart)
        near = self.order(cfg, values)
        out = []
        while apart:
            best: tuple[tuple[float, ...], Point, Point, set[int]] | None = None
            for a, b, differ, to, of in self._pairs:
                moves = {i for i in differ if i in apart and to[i] == values[i] and of[i] == have[i]}
                beside = [i for i in differ if i not in moves]
                if not moves or len(beside) > MOST_BESIDE or differing.intersection(beside):
                    continue
                rank = (len(differ) - len(moves), -len(moves), *near(a), b.index)
                if best is None or rank < best[0]:
                    best = (rank, a, b, moves)
            if best is None:
                break  # a knob the landscape never varied near here: as the point ran
            out.append((best[1], best[2]))
            apart -= best[3]
        return out

    def out_of_memory(self, cfg: TrialConfig) -> bool:
        """Whether ``cfg`` runs out of device memory: its micro-batch is above every point of
        its precision that ran, and either at or beyond one that ran out of memory, or where the
        peak of the largest that ran, scaled with the batch, would exceed the device's memory."""
        precision = self.precision_of(cfg)
        mine = [p for p in self.points if p.precision == precision] or list(self.points)
        ran = [p for p in mine if p.ran]
        batch = cfg.micro_batch
        top = max((p.batch for p in ran), default=0)
        if batch <= top:
            return False
        if any(p.failure == OUT_OF_MEMORY and p.batch <= batch for p in mine):
            return True
        peaks = [p.peak_mb for p in ran if p.batch == top and p.peak_mb is not None]
        return bool(peaks) and max(peaks) * batch / top > self.memory_mb

    def best(self, allowed: Callable[[TrialConfig], bool] = lambda cfg: True) -> Point:
        """The fastest point that ran whose configuration ``allowed`` accepts."""
        fits = [p for p in self.ran if allowed(p.config)]
        if not fits:
            raise LandscapeError(f"{self.path}: no point that ran is allowed")
        return max(fits, key=lambda p: (p.samples_per_s or 0.0, -p.index))

    def rate(self, cfg: TrialConfig) -> float:
        """What ``cfg`` runs at, without noise (the module's docstring says how); 0 where it
        fails."""
        return self.replay(cfg).rate or 0.0


def landscapes() -> list[Path]:
    """The landscape fixtures, by name."""
    return sorted(FIXTURES.glob("*.json"))


class LandscapeNode(SimulatedGpuNode):
    """A simulated one-GPU node (``SimulatedGpuNode``) whose trials run as ``landscape``
    recorded them: at ``Landscape.rate`` (with ``corrected=False``: the nearest point's own
    rate) times seeded normal noise of the nearest point's spread (sd = spread / 1.35, an IQR's
    normal sd; the seed: ``seed``, the configuration and how often it was asked before);
    holding the nearest point's peak memory scaled to the micro-batch, out of memory where the
    landscape says, failing where the nearest point failed otherwise; a fresh process sets up in
    the recorded setup_s, a compile costs the recorded compile_s of its mode (from the node's
    cache: the recorded recompile_s, else 15% of it); a profiled run reports the nearest
    profiled point's shares."""

    def __init__(self, doc: dict[str, Any], landscape: Landscape, *, seed: int = 0, corrected: bool = True) -> None:
        costs = landscape.header["costs"]
        defaults = SimCosts()
        super().__init__(doc, costs=dataclasses.replace(
            defaults, start_s=landscape.setup_s,
            warmup_s=float(costs.get("warmup_s") or defaults.warmup_s),
            recompile_s=float(costs.get("recompile_s") or defaults.recompile_s)))
        self.landscape, self.seed, self.corrected = landscape, seed, corrected
        self.asked: dict[str, int] = {}  # how often each configuration's rate was asked
        for device in self.devices:
            device.memory_bytes = int(landscape.memory_mb * 2**20)

    def noise(self, cfg: TrialConfig, spread: float) -> float:
        key = json.dumps(cfg.to_dict(), sort_keys=True)
        count = self.asked[key] = self.asked.get(key, 0) + 1
        digest = hashlib.sha256(f"{self.seed}|{key}|{count}".encode()).digest()
        draw = random.Random(int.from_bytes(digest[:8], "big")).gauss(0.0, spread / 1.35)
        return max(0.5, 1.0 + draw)

    def throughput(self, cfg: TrialConfig) -> float:
        replayed = self.landscape.replay(cfg)
        rate = replayed.rate if self.corrected else replayed.point.samples_per_s
        if rate is None:
            return 1e-9  # never measured: admit() turned it away
        return rate * self.noise(cfg, replayed.point.spread)

    def rank_bytes(self, cfg: TrialConfig) -> int:
        memory = self.landscape.memory_mb
        point = self.landscape.nearest(cfg)
        if point.failure == OUT_OF_MEMORY:
            return 2 * int(memory * 2**20)
        if point.peak_mb is None:
            return GiB // 4
        mb = min(point.peak_mb * cfg.micro_batch / point.batch, 0.95 * memory)  # fits: as the landscape says
        return int(mb * 2**20)

    def admit(self, cfg: TrialConfig, name: str) -> tuple[int | None, TrialResult | None]:
        point = self.landscape.nearest(cfg)
        if point.failure not in (None, OUT_OF_MEMORY) and cfg.device == "cuda":
            self.ran.append((name, cfg))
            self.timeline.append((name, self.clock))
            return self._fail(name, str(point.failure), f"as recorded at {point.config.short()}")
        return super().admit(cfg, name)

    def cold_compile_s(self, cfg: TrialConfig) -> float:
        recorded = self.landscape.compile_s(cfg.compile.value)
        return super().cold_compile_s(cfg) if recorded is None else recorded

    def cached_compile_s(self, cfg: TrialConfig) -> float:
        if self.landscape.header["costs"].get("recompile_s") is not None:
            return self.costs.recompile_s
        return 0.15 * self.cold_compile_s(cfg)

    def step_profile(self, cfg: TrialConfig) -> StepProfile | None:
        profiled = [p for p in self.landscape.ran if p.shares]
        if not profiled:
            return None
        near = min(profiled, key=self.landscape.order(cfg, self.landscape.values_of(cfg)))
        rate = self.landscape.rate(cfg) or near.samples_per_s or 1.0
        return StepProfile(step_ms=1000.0 * cfg.batch_size / rate, steps=20, device="cuda", source="gpu kernels",
                           shares=dict(near.shares or {}))
