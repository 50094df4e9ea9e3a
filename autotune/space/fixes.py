"""The user's ``--fix`` pins, read: ``KNOB=VALUE`` items to typed values, each knob checked
against TrialConfig's fields."""
from __future__ import annotations

import dataclasses
from typing import Any

from autotune.config import LR_FIELDS, LR_SCALINGS, KnobValue, Layout, TrialConfig
from autotune.errors import UsageError

# Knobs the user may pin with --fix, with how to read their value.
_BOOL = {"true": True, "1": True, "yes": True, "on": True,
         "false": False, "0": False, "no": False, "off": False}


def _parse_value(field: dataclasses.Field[Any], text: str) -> Any:
    kind = str(field.type)
    if text.lower() in ("none", "default") and "None" in kind:
        return None
    try:
        if kind.startswith("int"):
            return int(text)
        if kind.startswith("float"):
            return float(text)
        if kind.startswith("bool"):
            return _BOOL[text.lower()]
    except (ValueError, KeyError):
        raise UsageError(f"--fix {field.name}={text}: expected {kind.replace(' | None', '')}") from None
    return text


def parse_fixes(items: list[str]) -> dict[str, KnobValue]:
    """``["batch_size=64", "precision=fp32"]`` -> typed values; unknown knobs are errors."""
    fields = {f.name: f for f in dataclasses.fields(TrialConfig)}
    fixed: dict[str, KnobValue] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--fix {item!r}: expected KNOB=VALUE, e.g. --fix batch_size=64")
        if name == "layout":  # as progress lines print it: both knobs at once
            try:
                fixed["nprocs"], fixed["threads"] = Layout.parse(text)
            except UsageError as exc:
                raise UsageError(f"--fix {exc}") from None
            continue
        if name in LR_FIELDS:
            raise UsageError(f"--fix {name}: the learning rate's rule is not a knob; give --scale-lr "
                             f"{{{','.join(LR_SCALINGS)}}} (scale_lr= in tune()), and it follows each "
                             "configuration's batch size from yours")
        if name not in fields:
            raise UsageError(
                f"--fix {name}: unknown knob. Knobs: "
                f"{', '.join(sorted([*(f for f in fields if f not in LR_FIELDS), 'layout']))}"
            )
        fixed[name] = _parse_value(fields[name], text.strip())
    try:
        ranks = fixed.get("nprocs", 1)  # a batch they split, so that only the pins are judged
        TrialConfig.from_dict({"batch_size": ranks if isinstance(ranks, int) else 1, **fixed})
    except UsageError as exc:
        raise UsageError(f"--fix: {exc}") from None
    return fixed
