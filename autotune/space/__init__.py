"""The search space: which knobs exist on this machine and model, and why the others do not.

``build_space`` composes one builder per knob (``choices``, ``conditional``, ``gpu``) and
the user's ``--fix`` pins (``fixes``); ``Space`` asks Optuna for a configuration and turns
one into Optuna's params and back."""
from __future__ import annotations

from autotune.space.build import LATE_KNOBS, MEMORY_KNOBS, Space, Unsplittable, build_space

__all__ = ["LATE_KNOBS", "MEMORY_KNOBS", "Space", "Unsplittable", "build_space"]
