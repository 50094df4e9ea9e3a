"""Sizes as people read them, for the probe's text and its warnings."""
from __future__ import annotations


def format_bytes(value: int | None) -> str:
    """Binary units with at most one decimal: 1536 -> "1.5 KiB"."""
    if value is None:
        return "none"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):  # noqa: B007  (the unit is read after the loop)
        if size < 1024:
            break
        size /= 1024
    else:
        unit = "TiB"
    number = f"{size:.1f}".rstrip("0").rstrip(".")
    return f"{number} {unit}"

