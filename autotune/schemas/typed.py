"""Documents read into their types and written from them, by pydantic (its TypeAdapter over
the dataclasses that hold them), and their JSON Schemas generated from the same types: the
probe document (``probes.Machine``) and an error under ``--json`` (``errors.ErrorDocument``)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import TypeAdapter

from autotune.runtime.json_value import JsonObject

T = TypeVar("T")


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _adapter(kind: Any) -> TypeAdapter[Any]:
    # one per type, made on first use: building one walks the whole type
    if kind not in _ADAPTERS:
        _ADAPTERS[kind] = TypeAdapter(kind)
    return _ADAPTERS[kind]


def read(kind: type[T], doc: Mapping[str, Any]) -> T:
    """``doc`` as ``kind``; keys it does not know are left out, those it lacks take their
    defaults. Raises pydantic's ValidationError (a ValueError) where a value has the wrong type."""
    return _adapter(kind).validate_python(doc)


def written(value: object) -> JsonObject:
    """``value`` as JSON holds it: tuples as lists, integer keys as strings."""
    return _adapter(type(value)).dump_python(value, mode="json")


def schema(kind: type[Any]) -> dict[str, Any]:
    """The JSON Schema of what ``written`` makes of a ``kind``."""
    return _adapter(kind).json_schema(mode="serialization")
