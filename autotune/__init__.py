"""autotune: find the fastest verified training configuration for a PyTorch model."""
from __future__ import annotations

from autotune.config import TrialConfig
from autotune.errors import AutotuneError, ContractError, UsageError

__version__ = "0.1.0"

__all__ = ["AutotuneError", "ContractError", "TrialConfig", "UsageError", "__version__"]
