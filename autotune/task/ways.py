"""The ways in for a script the user runs, registered: one line each (``way_in.WayIn``)."""
from __future__ import annotations

from autotune.task import lightning_script, loop_script, trainer_script
from autotune.task.way_in import WayIn


def ways() -> tuple[WayIn, ...]:
    """The registered ways in, in the order their recognition is tried: a file that builds a
    Trainer is the Trainer's, and only a file that builds none is a plain loop."""
    return (
        lightning_script.WAY,
        trainer_script.WAY,
        loop_script.WAY,
    )
