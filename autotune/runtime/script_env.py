"""The environment of every process autotune starts on a user's script (its check, its trials):
nothing is downloaded at run time, whichever way in runs it."""
from __future__ import annotations

from collections.abc import Mapping


def offline_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the Hub offline (a model or data set the script needs is on the machine, or
    named as missing) and the script's integrations quiet."""
    return {**env, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "WANDB_MODE": "disabled", "HF_HUB_DISABLE_TELEMETRY": "1"}
