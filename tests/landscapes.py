"""GPU landscapes, replayed: a workload's configurations as a GPU measured them
(``bench/gpu_landscape.py`` writes them into tests/fixtures/landscapes/), and a simulated GPU
node that answers trials from one, so that the search's policy is tested on CPU CI against a
known best.

A landscape holds points: a configuration (the knobs it sets; the rest at their defaults),
its samples/s and their spread between windows (IQR over median), its peak device memory,
and where it was measured, where its step went; or the failure it met (out of memory). Its
costs: a fresh process's setup, the warm-up, each compile mode's cold compile. A file whose
``recorded`` is false was shaped by hand (``bench/shape_landscape.py``), not measured: its
``source`` says after what.

``Landscape.nearest`` is the recorded point a configuration runs as: the one that agrees with
it most (a batch twice as far counts as one knob apart), so a knob the landscape never
varied at some point takes its value from the nearest point that varied it.
"""
from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autotune.config import TrialConfig
from autotune.runtime.step_profile import StepProfile

from simulated_gpu_node import GiB, SimCosts, SimulatedGpuNode

FIXTURES = Path(__file__).parent / "fixtures" / "landscapes"
# How far apart two configurations are in each knob a landscape records: the precision and
# the compile mode change what runs; the others, how it is fed and placed.
WEIGHTS = {"precision": 1.0, "compile": 1.0, "cudnn_benchmark": 0.5, "channels_last": 0.5,
           "optimizer_step": 0.5, "pin_memory": 0.25, "expandable_segments": 0.25}
DEFAULTS = TrialConfig(batch_size=1).to_dict()
HEADER = ("workload", "recorded", "source", "device", "memory_mb", "torch", "commit", "date", "user_batch",
          "costs", "points")


class LandscapeError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class Point:
    knobs: Mapping[str, Any]  # what the point sets; the rest at TrialConfig's defaults
    samples_per_s: float | None
    spread: float
    peak_mb: float | None
    failure: str | None = None
    shares: Mapping[str, float] | None = None  # where its step went, where profiled

    def value(self, knob: str) -> Any:
        return self.knobs.get(knob, DEFAULTS.get(knob))

    @property
    def batch(self) -> int:
        return int(self.knobs["batch_size"])

    def config(self, base: TrialConfig) -> TrialConfig:
        return base.replace(**self.knobs)


def distance(cfg: TrialConfig, point: Point) -> float:
    mine = cfg.to_dict()
    far = abs(math.log2(cfg.batch_size / point.batch))
    far += 0.5 * abs(math.log2(1 + int(mine["num_workers"] or 0)) - math.log2(1 + int(point.value("num_workers") or 0)))
    return far + sum(w for k, w in WEIGHTS.items() if str(mine.get(k)) != str(point.value(k)))


@dataclasses.dataclass(frozen=True)
class Landscape:
    path: Path
    doc: Mapping[str, Any]
    points: tuple[Point, ...]

    @classmethod
    def load(cls, path: Path) -> Landscape:
        doc = json.loads(Path(path).read_text())
        missing = [k for k in HEADER if k not in doc]
        if missing:
            raise LandscapeError(f"{path}: no {', '.join(missing)} in the landscape")
        points = []
        for i, p in enumerate(doc["points"]):
            if "config" not in p or "batch_size" not in p["config"]:
                raise LandscapeError(f"{path}: point {i} has no config with a batch_size")
            rate = p.get("samples_per_s")
            if rate is None and not p.get("failure"):
                raise LandscapeError(f"{path}: point {i} has neither samples_per_s nor a failure")
            points.append(Point(knobs=dict(p["config"]), samples_per_s=None if rate is None else float(rate),
                                spread=float(p.get("spread") or 0.0), peak_mb=p.get("peak_mb"),
                                failure=p.get("failure"), shares=p.get("shares")))
        return cls(Path(path), doc, tuple(points))

    @property
    def workload(self) -> str:
        return str(self.doc["workload"])

    @property
    def memory_mb(self) -> float:
        return float(self.doc["memory_mb"])

    def nearest(self, cfg: TrialConfig) -> Point:
        """The point ``cfg`` runs as; out of memory where a point at its batch or below, in its
        precision, ran out, or its peak scaled to ``cfg``'s batch would not fit."""
        point = min(self.points, key=lambda p: (distance(cfg, p), -(p.samples_per_s or 0.0)))
        failed = [p for p in self.points if p.failure == "out_of_memory" and p.batch <= cfg.batch_size
                  and str(p.value("precision")) == str(cfg.precision)]
        if failed:
            return failed[0]
        if point.peak_mb is not None and point.peak_mb * cfg.batch_size / point.batch > self.memory_mb:
            return dataclasses.replace(point, samples_per_s=None, failure="out_of_memory")
        return point

    def best(self, allowed: Callable[[Point], bool] = lambda p: True) -> Point:
        ran = [p for p in self.points if p.samples_per_s is not None and allowed(p)]
        return max(ran, key=lambda p: p.samples_per_s or 0.0)

    def rate(self, cfg: TrialConfig) -> float:
        """What ``cfg`` runs at, as recorded (no noise); 0 where it fails."""
        return self.nearest(cfg).samples_per_s or 0.0


def landscapes() -> list[Path]:
    return sorted(FIXTURES.glob("*.json"))


class LandscapeNode(SimulatedGpuNode):
    """A simulated one-GPU node whose trials run as ``landscape`` recorded them: the nearest
    point's rate with its recorded spread as noise (seeded), its peak memory, its profile;
    the landscape's setup, warm-up and compile costs."""

    def __init__(self, doc: dict, landscape: Landscape, *, seed: int = 0) -> None:
        costs = landscape.doc["costs"]
        compiles = costs.get("compile_s") or {}
        super().__init__(doc, costs=SimCosts(
            start_s=float(costs["setup_s"]), warmup_s=float(costs.get("warmup_s", 2.0)),
            compile_s=float(compiles.get("default", SimCosts.compile_s)),
            autotune_s=float(compiles.get("max-autotune-no-cudagraphs", SimCosts.autotune_s)),
            recompile_s=float(costs.get("recompile_s", SimCosts.recompile_s))))
        self.landscape = landscape
        self.random = random.Random(seed)
        for device in self.devices:
            device.memory_bytes = int(landscape.memory_mb * 2**20)

    def throughput(self, cfg: TrialConfig) -> float:
        point = self.landscape.nearest(cfg)
        rate = point.samples_per_s or 1e-9
        return rate * max(0.5, 1.0 + self.random.gauss(0.0, point.spread / 1.35))

    def rank_bytes(self, cfg: TrialConfig) -> int:
        point = self.landscape.nearest(cfg)
        if point.failure == "out_of_memory":
            return 2 * int(self.landscape.memory_mb * 2**20)
        return int((point.peak_mb or 0.0) * cfg.batch_size / point.batch * 2**20) or GiB // 4

    def step_profile(self, cfg: TrialConfig) -> StepProfile | None:
        near = min((p for p in self.landscape.points if p.shares),
                   key=lambda p: distance(cfg, p), default=None)
        if near is None or near.shares is None:
            return None
        return StepProfile(step_ms=1000.0 * cfg.batch_size / self.landscape.rate(cfg), steps=20, device="cuda",
                           source="gpu kernels", shares=dict(near.shares))
