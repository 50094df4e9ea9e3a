"""A rank's peak memory while it trains one configuration: what ``--memory-limit`` bounds.

On CPU, the process's resident set at its high-water mark (Linux's ``VmHWM``), reset when a
configuration starts: a warm process's earlier configurations do not count, what it holds
for all of them (torch, the data set) does. On CUDA, the caching allocator's reservation at
its peak: what another process on the device would find taken (``Session.release`` resets
it between configurations).
"""
from __future__ import annotations

import contextlib
import re
import resource
from typing import Any

from autotune.runtime.knobs import Device

_HWM = re.compile(r"^VmHWM:\s+(\d+)\s+kB", re.MULTILINE)


def reset_host_peak() -> None:
    """Start the resident set's high-water mark afresh (Linux 4.0 or later; elsewhere the
    peak stays the process's own since it started)."""
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def host_peak_mb() -> float:
    """The resident set's high-water mark since the last reset, in MiB."""
    try:
        with open("/proc/self/status") as f:
            found = _HWM.search(f.read())
        if found:
            return int(found.group(1)) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def peak_mb(device: Any) -> float:
    """This rank's peak for ``device`` (a torch.device), in MiB."""
    if device.type == Device.CUDA:
        import torch

        return torch.cuda.max_memory_reserved(device) / 2**20
    return host_peak_mb()
