"""What the process-level knobs did to a process (``ProcessFacts``), as a trial's SETUP
event and train_tuned.py's report carry it. ``facts.process_facts`` reads them (with
torch); this module imports no torch, for the tuner reads them back from the events."""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ProcessFacts:
    """What the process-level knobs did to this process: torch's threads, the cores it may
    run on, the shared objects it mapped (which allocator is loaded) and the environment
    variables the knobs set (None: unset)."""

    threads: int | None
    interop_threads: int | None = None
    affinity: list[int] = dataclasses.field(default_factory=list)
    libraries: list[str] = dataclasses.field(default_factory=list)
    env: dict[str, str | None] = dataclasses.field(default_factory=dict)


