"""The fp32 references the gates compare a candidate with (``autotune.verify.numerics``,
``autotune.verify.quality``), where they run (at the candidate's batch, or, where fp32 runs
out of memory there, at the largest batch it holds) and where they are kept between runs."""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune.config import TrialConfig
from autotune.outdir import write_atomically
from autotune.runtime.knobs import Device
from autotune.search import memory
from autotune.search.outcome import SearchOutcome
from autotune.trials.events import DoneEvent
from autotune.trials.logs import read_event
from autotune.trials.protocol import Event, Failure, Status
from autotune.trials.runner import TrialResult

# Knobs that only place or feed the work (threads, allocator, pinning, DataLoader
# workers): they change no arithmetic beyond the order of a sum, so two candidates that
# differ only in them share one training.
PLACEMENT_KNOBS = ("threads", "interop_threads", "num_workers", "persistent_workers",
                   "prefetch_factor", "pin_memory", "allocator", "affinity")


# What a reference takes from the fastest configuration the search measured that computes
# what it computes: the knobs that place or feed the work, and cuDNN's benchmark, which picks
# among kernels for the same convolution. An fp32 reference on the baseline's knobs (no
# DataLoader workers, unpinned) may train several times slower than the candidates it checks.
FEEDING_KNOBS = (*PLACEMENT_KNOBS, "cudnn_benchmark")
# What such a configuration may differ in from the reference besides FEEDING_KNOBS: the
# tensors' memory layout, the optimizer's step (fused or per tensor) and the CUDA allocator
# compute the same to rounding, and say how fast the reference's own knobs run.
ALIKE_BESIDE = (*FEEDING_KNOBS, "channels_last", "optimizer_step", "expandable_segments")


def work_key(cfg: TrialConfig) -> str:
    """``cfg`` less its placement knobs: configurations with one key compute the same."""
    return json.dumps({k: v for k, v in cfg.to_dict().items() if k not in PLACEMENT_KNOBS},
                      sort_keys=True)


def _alike_key(cfg: TrialConfig) -> str:
    return json.dumps({k: v for k, v in cfg.to_dict().items() if k not in ALIKE_BESIDE}, sort_keys=True)


Measured = tuple[tuple[TrialConfig, float], ...]  # configurations the search measured, with samples/s


def fastest_alike(ref: TrialConfig, measured: Measured) -> tuple[TrialConfig, float] | None:
    """The fastest of ``measured`` that computes what ``ref`` computes, to rounding (the same
    precision, compile, batch, ranks, pruning and memory knobs: it differs at most in
    ``ALIKE_BESIDE``), with its samples/s; None where the search measured none."""
    key = _alike_key(ref)
    alike = [(cfg, rate) for cfg, rate in measured if rate and _alike_key(cfg) == key]
    return max(alike, key=lambda found: found[1]) if alike else None


def measured_rates(outcome: SearchOutcome) -> Measured:
    """Each configuration the search measured, with its samples/s: where the gates'
    references train (``reference.trained_fast``) and what their trainings cost."""
    return tuple((c.config, float(c.measured.samples_per_s)) for c in outcome.ranked if c.measured.samples_per_s)


def trained_fast(ref: TrialConfig, measured: Measured) -> TrialConfig:
    """``ref`` (an fp32 reference, or the user's configuration the batch check trains) with
    the ``FEEDING_KNOBS`` of the fastest configuration the search measured that computes what
    it computes (``fastest_alike``): its losses and scores are the same to fp32's rounding,
    sooner. ``ref`` itself where none was measured."""
    found = fastest_alike(ref, measured)
    if found is None:
        return ref
    return ref.replace(**{k: getattr(found[0], k) for k in FEEDING_KNOBS})


def numerics_reference(baseline: TrialConfig, cand: TrialConfig) -> TrialConfig:
    """fp32, eager, default threads, at the candidate's batch size and pruning: what the
    candidate must compute the same as. On CPU one process; on GPUs the candidate's own
    ranks, since one GPU may not hold the global batch that eight hold (fp32 ranks and
    one process agree to rounding: the global batches are the same)."""
    ref = baseline.replace(batch_size=cand.batch_size, prune_ratio=cand.prune_ratio)
    if cand.device == Device.CUDA and cand.nprocs > 1:
        ref = ref.replace(nprocs=cand.nprocs, threads=cand.threads)
    return ref


def quality_reference(baseline: TrialConfig, cand: TrialConfig) -> TrialConfig:
    """What the quality check compares against: the numerics check's reference, unpruned.
    Only the knobs that trade quality differ; a larger batch is not judged here (it
    changes training dynamics, not what a step computes)."""
    return numerics_reference(baseline, cand).replace(prune_ratio=0.0)


def smaller_batch(cfg: TrialConfig) -> int | None:
    """Half ``cfg``'s global batch, when its ranks still split it; None when it cannot shrink."""
    half = cfg.batch_size // 2
    return half if half >= cfg.nprocs and half % cfg.nprocs == 0 else None


def _out_of_memory(result: TrialResult) -> bool:
    return result.status != Status.OK and result.failure == Failure.OUT_OF_MEMORY


@dataclasses.dataclass(frozen=True)
class Fitted:
    """``where_fp32_fits``'s trainings by role (no candidate's where the reference failed),
    the reference and the candidate as they ran, and why they shrank."""

    results: dict[str, TrialResult]
    reference: TrialConfig
    candidate: TrialConfig
    notes: list[str]


def where_fp32_fits(run: Callable[[TrialConfig, str], TrialResult], ref: TrialConfig,
                     cand: TrialConfig) -> Fitted:
    """Run the fp32 reference, then the candidate (``run(cfg, role)``). Where the reference
    runs out of memory at the candidate's batch (reduced precision holds larger batches),
    both go to half the batch, until fp32 fits: what a reference checks is the knob's
    effect on the arithmetic, at the largest batch fp32 holds."""
    notes: list[str] = []
    while True:
        results = {"reference": run(ref, "reference")}
        half = smaller_batch(cand)
        held = memory.holding_as(ref, cand) if _out_of_memory(results["reference"]) else None
        if held is not None:
            notes.append(f"the fp32 reference ran out of memory at batch {cand.batch_size}: it ran with "
                         f"the candidate's {' and '.join(memory.knobs_on(cand))}, which compute the same "
                         "to rounding")
            ref = held
            continue
        if _out_of_memory(results["reference"]) and half is not None:
            notes.append(f"the fp32 reference ran out of memory at batch {cand.batch_size}")
            ref, cand = ref.replace(batch_size=half), cand.replace(batch_size=half)
            continue
        if results["reference"].status == Status.OK:
            results["candidate"] = run(cand, "candidate")
        return Fitted(results, ref, cand, notes)

KEPT_REFERENCES = "references.json"


class KeptReferences:
    """The scored fp32 trainings of a model file, kept in the output folder
    (``KEPT_REFERENCES``) so that a re-run and ``autotune verify`` read them instead of
    training them again: fp32 from one seed computes the same run after run, to rounding.
    A training is found by what determines it: the model file's bytes, torch's version,
    what it computes (``work_key``), its seed, steps and evaluation points (and a script's
    arguments and metric). A file that
    cannot be read is started afresh: what it held is trained again, nothing worse."""

    def __init__(self, path: Path, *, model_file: Path, runs_with: object = None) -> None:
        self.path = path
        # a script's arguments and metric (its facts, ``runs_with``) decide its trainings as its bytes do
        extra = json.dumps(runs_with, sort_keys=True, default=str).encode() if runs_with is not None else b""
        self.model = hashlib.sha256(model_file.read_bytes() + extra).hexdigest()

    def _key(self, cfg: TrialConfig, *, seed: int, steps: int, evaluate_at: tuple[int, ...]) -> str:
        return hashlib.sha256(json.dumps([self.model, torch_version(), work_key(cfg), seed, steps,
                                          list(evaluate_at)]).encode()).hexdigest()

    def _all(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}
        return data.get("trainings", {}) if isinstance(data, dict) else {}

    def read(self, cfg: TrialConfig, *, seed: int, steps: int, evaluate_at: tuple[int, ...]) -> TrialResult | None:
        found = self._all().get(self._key(cfg, seed=seed, steps=steps, evaluate_at=evaluate_at))
        if not isinstance(found, dict):
            return None
        done = read_event({**found["done"], "e": Event.DONE.value})
        return TrialResult(status=Status.OK, done=done) if isinstance(done, DoneEvent) else None

    def write(self, cfg: TrialConfig, result: TrialResult, *, seed: int, steps: int,
              evaluate_at: tuple[int, ...]) -> None:
        """Keep ``result`` where it scored (a failed or unscored training is not kept)."""
        if result.status != Status.OK or result.done is None or result.metric is None:
            return
        trainings = self._all()
        trainings[self._key(cfg, seed=seed, steps=steps, evaluate_at=evaluate_at)] = {
            "config": cfg.short(), "seed": seed, "steps": steps, "done": result.done.to_json()}
        write_atomically(self.path, json.dumps({"trainings": trainings}, indent=1))


def torch_version() -> str:
    import torch

    return str(torch.__version__)
