"""autotune: find the fastest verified training configuration for a PyTorch model.

    import autotune
    result = autotune.tune("my_model.py", trials=12)   # the same run as `autotune run`
    print(result.speedup, result.launcher)
    autotune.load("autotune-out/my_model")             # an earlier run's result
    autotune.probe()                                   # what this machine offers
"""
from __future__ import annotations

from typing import Any

from autotune.config import TrialConfig
from autotune.errors import AutotuneError, ContractError, NotVerified, UsageError

__version__ = "0.1.0"

__all__ = ["AutotuneError", "ContractError", "NotVerified", "Result", "Speedup", "TrialConfig",
           "UsageError", "__version__", "load", "probe", "tune"]

# Imported on first use: every trial process imports this package (for its runtime), and
# the run's machinery (Optuna, the search) has no business there.
_LAZY = {"tune": "autotune.api", "probe": "autotune.api", "load": "autotune.result",
         "Result": "autotune.result", "Speedup": "autotune.result"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'autotune' has no attribute {name!r}")
