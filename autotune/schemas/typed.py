"""Documents read into their types and written from them, by pydantic (its TypeAdapter over
the dataclasses that hold them), and their JSON Schemas generated from the same types: the
probe document (``probes.Machine``), an error under ``--json`` (``errors.ErrorDocument``) and
the parts of best_config.json whose JSON is their fields (``Record``).

A part whose published JSON is not its fields (an interval spelled as its parent's keys, a
check's free-form figures) keeps its own ``to_json`` and ``from_json``; ``HandWritten`` lets
pydantic read and write it through them where it sits inside a typed part."""
from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, TypeVar

from pydantic import (
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from typing_extensions import Self

from autotune.runtime.json_value import JsonObject, own_codec

T = TypeVar("T")


def _is_none(value: object) -> bool:
    return value is None


def _is_empty(value: object) -> bool:
    return not value


# A field written only where it is set: an absent key, not a null, where a part did not happen.
Omitted = Annotated[T | None, Field(exclude_if=_is_none)]
# A mapping or list written only where it holds something: a document without one reads as
# an earlier version wrote it.
OmittedEmpty = Annotated[T, Field(exclude_if=_is_empty)]


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _adapter(kind: Any) -> TypeAdapter[Any]:
    # one per type, made on first use: building one walks the whole type
    if kind not in _ADAPTERS:
        _ADAPTERS[kind] = TypeAdapter(kind)
    return _ADAPTERS[kind]


def read(kind: type[T], doc: object) -> T:
    """``doc`` as ``kind``; keys it does not know are left out, those it lacks take their
    defaults. Raises pydantic's ValidationError (a ValueError) where a value has the wrong type."""
    return _adapter(kind).validate_python(doc)


def written(value: object) -> JsonObject:
    """``value`` as JSON holds it: tuples as lists, integer keys as strings, ``Omitted``
    fields left out where unset."""
    return _adapter(type(value)).dump_python(value, mode="json", by_alias=True)


def schema(kind: type[Any]) -> JsonSchemaValue:
    """The JSON Schema of what ``written`` makes of a ``kind``."""
    return _adapter(kind).json_schema(mode="serialization", by_alias=True)


def fields_schema(core: Any, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
    """The JSON Schema of a dataclass's fields as pydantic writes them, whatever serializer
    the dataclass has: what a part that writes them otherwise starts its own schema from.
    Every field it writes is required, but those ``Omitted`` where unset."""
    plain = {k: v for k, v in core.items() if k != "serialization"}
    out = copy.deepcopy(handler.resolve_ref_schema(handler(plain)))
    node = core  # the dataclass's arguments, under any validator wrapped around them
    while "fields" not in node or node.get("type") == "dataclass":
        node = node["schema"]
    omitted = {f.get("serialization_alias", f["name"]) for f in node["fields"] if "serialization_exclude_if" in f}
    out["required"] = [name for name in out.get("properties", {}) if name not in omitted]
    return out


class Record:
    """A dataclass whose JSON is its fields, read and written by pydantic. Its schema
    refuses a key it does not write (reading passes one over: a later version's)."""

    __pydantic_config__: ClassVar[ConfigDict] = ConfigDict(json_schema_extra={"additionalProperties": False})

    @classmethod
    def __get_pydantic_json_schema__(cls, core: Any, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return fields_schema(core, handler)

    def to_json(self) -> JsonObject:
        return written(self)

    @classmethod
    def from_json(cls, data: object) -> Self:
        return read(cls, data)


class Flattened:
    """A ``Record`` one of whose parts, the field ``FLAT`` (a ``Record`` too), is written
    as its own keys among the part's, and read back from them."""

    FLAT: ClassVar[str]

    @model_serializer(mode="wrap")
    def _flatten(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        return {**out.pop(self.FLAT), **out}

    @classmethod
    def __get_pydantic_json_schema__(cls, core: Any, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        own = fields_schema(core, handler)
        flat = copy.deepcopy(handler.resolve_ref_schema(own["properties"].pop(cls.FLAT)))
        required = [k for k in own.get("required", []) if k != cls.FLAT]
        own["properties"] = {**flat["properties"], **own["properties"]}
        own["required"] = sorted({*required, *flat.get("required", [])})
        return own

    @model_validator(mode="before")
    @classmethod
    def _gather(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and cls.FLAT not in data:
            return {**data, cls.FLAT: data}  # the part's reader passes over the keys not its own
        return data


class HandWritten:
    """A part with its own ``to_json`` and ``from_json`` classmethod, which pydantic calls
    where the part sits inside a ``Record``; ``JSON_SCHEMA`` says what ``to_json`` writes."""

    JSON_SCHEMA: ClassVar[JsonSchemaValue]

    @classmethod
    def __get_pydantic_json_schema__(cls, core: Any, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return copy.deepcopy(cls.JSON_SCHEMA)

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> Any:
        # its subclasses define both: looked up by name, as this base cannot declare them
        # without becoming a reader and writer of its own
        return own_codec(cls, read=getattr(cls, "from_json"), write=lambda part: part.to_json())  # noqa: B009
