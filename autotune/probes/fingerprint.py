"""What a tuned configuration is valid for, and how two machines differ.

The fingerprint keeps only facts that change which configuration is best
(CPU model, usable cores, ISA, GPUs, torch build, allocators); volatile
readings such as free memory stay out so the id is stable across runs.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from autotune.runtime.json_value import JsonObject, JsonValue

from ._machine import MachineLike, as_machine
from .cuda_visible import current_visible_devices, usable_gpus

FINGERPRINT_VERSION = 1


_FROM_ENVIRONMENT: Any = object()


def fingerprint(doc: MachineLike, *, cuda_visible_devices: str | None = _FROM_ENVIRONMENT) -> JsonObject:
    """A machine (or its probe document) -> fingerprint dict.

    The GPUs are those a trial started from here sees (``cuda_visible_devices``, by
    default this process's CUDA_VISIBLE_DEVICES): a study tuned on eight GPUs is not
    the study of the same machine narrowed to four.
    """
    if cuda_visible_devices is _FROM_ENVIRONMENT:
        cuda_visible_devices = current_visible_devices()
    machine = as_machine(doc)
    cpu = machine.cpu
    gpus, _ = usable_gpus(machine, cuda_visible_devices)
    allocators = machine.allocators
    return {
        "version": FINGERPRINT_VERSION,
        "arch": cpu.arch,
        "cpu_model": cpu.model,
        "usable_cores": cpu.usable_cores,
        # Pinning choices depend on how many NUMA nodes our cores span.
        "numa_nodes": len(cpu.usable_numa_nodes or cpu.numa_nodes or {}) or None,
        "isa": sorted(flag for flag, present in cpu.isa.items() if present),
        "gpu_count": len(gpus),
        "gpu_names": [g.name for g in gpus],
        "torch_version": machine.torch.version,
        "torch_cuda": machine.torch.cuda,
        "allocators": sorted(name for name, path in allocators.items() if path),
    }


def fingerprint_id(doc_or_fingerprint: Mapping[str, JsonValue]) -> str:
    """12 hex chars of sha256 over the canonical JSON of the fingerprint."""
    fp = _as_fingerprint(doc_or_fingerprint)
    canonical = json.dumps(fp, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:12]


def fingerprint_diff(a: Mapping[str, JsonValue], b: Mapping[str, JsonValue]) -> list[str]:
    """Readable differences from ``a`` to ``b``; [] when equivalent.

    Accepts fingerprints or whole probe documents.
    """
    fa, fb = _as_fingerprint(a), _as_fingerprint(b)
    lines: list[str] = []
    for key in sorted(set(fa) | set(fb)):
        va, vb = fa.get(key), fb.get(key)
        if va == vb:
            continue
        if key in ("isa", "allocators") and isinstance(va, list) and isinstance(vb, list):
            lost = sorted(set(va) - set(vb))
            gained = sorted(set(vb) - set(va))
            parts = ([f"lost {', '.join(lost)}"] if lost else []) + ([f"gained {', '.join(gained)}"] if gained else [])
            lines.append(f"{key}: {'; '.join(parts)}")
        else:
            lines.append(f"{key}: {_show(va)} -> {_show(vb)}")
    return lines


def _as_fingerprint(data: Mapping[str, JsonValue]) -> JsonObject:
    # A probe document has a "cpu" section; a fingerprint never does.
    return fingerprint(data) if "cpu" in data else dict(data)


def _show(value: JsonValue) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)
