"""The user's model file: ``load_task`` checks its contract in a child process (``check``)
and describes it as a ``Task``; ``ContractError`` names what is wrong and the fix."""
from __future__ import annotations

from autotune.task.load import CHECK_TIMEOUT_S, Task, load_task

__all__ = ["CHECK_TIMEOUT_S", "Task", "load_task"]
