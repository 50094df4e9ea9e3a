"""The fp32 references the gates compare a candidate with (``autotune.verify.numerics``,
``autotune.verify.quality``), and where they run: at the candidate's batch, or, where fp32
runs out of memory there, at the largest batch it holds."""
from __future__ import annotations

from collections.abc import Callable

from autotune.config import TrialConfig
from autotune.runtime.knobs import Device
from autotune.search import memory
from autotune.trials.protocol import Failure, Status
from autotune.trials.runner import TrialResult


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


def where_fp32_fits(run: Callable[[TrialConfig, str], TrialResult], ref: TrialConfig,
                     cand: TrialConfig) -> tuple[dict[str, TrialResult], TrialConfig, list[str]]:
    """Run the fp32 reference, then the candidate (``run(cfg, role)``). Where the reference
    runs out of memory at the candidate's batch (reduced precision holds larger batches),
    both go to half the batch, until fp32 fits: what a reference checks is the knob's
    effect on the arithmetic, at the largest batch fp32 holds. Returns the results (no
    candidate's when the reference failed), the candidate as run, and why it shrank."""
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
        return results, cand, notes
