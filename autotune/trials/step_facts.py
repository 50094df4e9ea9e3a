"""What a trial reports for utilisation, with its first step's facts: the FLOPs per
sample of its configuration's training step (``runtime.flops``) and the peak FLOP/s of
its ranks in its precision (``probes.peaks``). Both are taken during the warm-up, outside
every timed window; the tuner multiplies FLOPs per sample by the samples/s it measures.
"""
from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from autotune.runtime.json_value import JsonObject
from autotune.runtime.knobs import Device

if TYPE_CHECKING:
    from autotune.probes.peaks import Peak
    from autotune.runtime.session import Session

# A warm process measures each precision's peak once: its threads (a process knob) and
# its ranks are those of every configuration it trains.
_PEAKS: dict[str, Peak] = {}


def rank_peak(session: Session, *, settle: Callable[[], None]) -> Peak:
    """The peak of all the session's ranks in its precision: a known GPU's table peak
    times the ranks, else the ranks' matmuls measured side by side (each on its own cores
    or GPU, as they train) and added up. ``settle``: waits for the DataLoader's workers
    to go idle (worker.settle)."""
    import torch

    from autotune.probes import peaks

    precision = str(session.cfg.get("precision") or "fp32")
    if precision in _PEAKS:
        return _PEAKS[precision]
    dist = session.dist
    device = dist.device

    def measure(wanted: str) -> Peak:
        if device.type == Device.CPU and session.loader.num_workers:
            settle()  # the DataLoader's workers filling their queue would slow the matmuls
        dist.barrier()
        try:
            one = peaks.measured_peak(device=device, precision=wanted)
        except Exception as exc:  # out of memory beside the model, say: no peak, the trial goes on
            print(f"autotune: matmul peak not measured: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            one = peaks.Peak(flop_per_s=0.0, source=f"measured:{device.type} {wanted} matmul failed")
            if device.type == Device.CUDA:
                torch.cuda.empty_cache()
        # every rank meets in both collectives, whichever failed
        failed = dist.agree_max(0.0 if one.flop_per_s else 1.0)
        total = float(dist.mean(torch.tensor(one.flop_per_s, dtype=torch.float64, device=device))) * dist.world
        return one.times(dist.world, total=0.0 if failed else total)

    peak = peaks.device_peak(
        device_type=device.type, precision=precision, measure=measure, ranks=dist.world,
        gpu_name=torch.cuda.get_device_name(device) if device.type == Device.CUDA else None,
        native_half=peaks.cpu_native_half().get(precision, True))
    _PEAKS[precision] = peak
    return peak


def utilisation_facts(session: Session, *, settle: Callable[[], None]) -> JsonObject:
    """The FACTS event's utilisation fields: ``flops_per_sample`` (None where it could
    not be counted) and the ranks' ``peak_flop_per_s`` with its ``peak_source``. Every
    rank calls this: a measured peak is added up over them."""
    import torch

    from autotune.runtime.flops import step_flops

    try:
        counted = step_flops(session)
    except Exception as exc:  # a figure for the report: never the trial's failure
        print(f"autotune: FLOPs not counted: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        counted = None
        if session.dist.device.type == Device.CUDA:
            torch.cuda.empty_cache()
    peak = rank_peak(session, settle=settle)
    return {"flops_per_sample": counted.per_sample if counted is not None else None,
            **peak.to_json()}
