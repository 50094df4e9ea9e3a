"""Where a step goes: one window of training under torch.profiler (the emitted script's
``--profile``, best_config.json's ``step_profile``; a profiled trial, which steers the
search), as shares of the step by category (``autotune.runtime.shares.Category``)."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from .json_value import JsonObject, own_codec
from .shares import Category


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepProfile:
    """``step_ms``: the profiled step, from the profiler's window; ``measured_step_ms``:
    the same window by the script's own clock; ``shares``: each category's part of the
    step (they add up to 1); ``source``: "cpu ops" or "gpu kernels"; ``device``: where
    the step ran; ``steps``: how many were profiled, after the warm-up."""

    step_ms: float
    steps: int
    device: str
    source: str
    shares: Mapping[str, float]
    measured_step_ms: float | None = None

    def share(self, category: Category) -> float:
        return float(self.shares.get(category.value, 0.0))

    def ranked(self) -> list[tuple[Category, float]]:
        """The categories with a share, largest first."""
        return sorted(((c, self.share(c)) for c in Category if self.share(c) > 0), key=lambda cs: -cs[1])

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        return own_codec(cls, read=cls.from_json, write=cls.to_json, json_schema=_SCHEMA)

    def to_json(self) -> JsonObject:
        return {"step_ms": self.step_ms, "steps": self.steps, "device": self.device, "source": self.source,
                "shares": {c.value: self.share(c) for c in Category},
                **({} if self.measured_step_ms is None else {"measured_step_ms": self.measured_step_ms})}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StepProfile:
        # a category the document predates reads as none of the step (convolutions were
        # counted in matmul before they had one of their own)
        shares = {c.value: 0.0 for c in Category} | {k: float(v) for k, v in data["shares"].items()}
        return cls(step_ms=float(data["step_ms"]), steps=int(data["steps"]), device=str(data["device"]),
                   source=str(data["source"]), shares=shares, measured_step_ms=data.get("measured_step_ms"))


_SHARE: JsonObject = {"type": "number", "minimum": 0, "maximum": 1}
# What ``to_json`` writes. Convolution is not required: documents written before it had a
# category of its own counted it in matmul.
_SCHEMA: JsonObject = {
    "type": "object", "additionalProperties": False, "required": ["step_ms", "steps", "device", "source", "shares"],
    "properties": {
        "step_ms": {"type": "number", "minimum": 0}, "measured_step_ms": {"type": "number", "minimum": 0},
        "steps": {"type": "integer", "minimum": 1}, "device": {"type": "string"},
        "source": {"enum": ["cpu ops", "gpu kernels"]},
        "shares": {"type": "object", "additionalProperties": False,
                   "required": [c.value for c in Category if c is not Category.CONVOLUTION],
                   "properties": {c.value: _SHARE for c in Category}}}}
