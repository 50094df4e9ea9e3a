"""Machine probes for autotune: what hardware and software this process
can actually use, as one JSON-able document, plus a stable fingerprint of
the facts a tuned configuration depends on.

    from autotune.probes import probe_machine, fingerprint_id
    doc = probe_machine().to_dict()
    fingerprint_id(doc)
"""
from __future__ import annotations

from ._machine import Machine, MachineLike, as_machine, probe_machine
from .fingerprint import fingerprint, fingerprint_diff, fingerprint_id
from .render import render_text

__all__ = [
    "Machine",
    "MachineLike",
    "as_machine",
    "fingerprint",
    "fingerprint_diff",
    "fingerprint_id",
    "probe_machine",
    "render_text",
]
