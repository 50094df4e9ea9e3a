"""What a JSON document holds, as a type. The writers of the files and events autotune
produces build ``JsonObject``s, so the type check proves each value is one ``json.dumps``
writes (a dataclass or a path left in by mistake is an error, not a crash at write time).
Readers turn a document back into a dataclass of their own; nothing reads a
``JsonObject`` by key across modules."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from typing_extensions import TypeAliasType

# Sequence and Mapping, not list and dict: they are covariant, so a list[float] or a
# dict[str, int] field is a JSON value as it stands. A named alias, so that pydantic, which
# reads the documents' types (autotune.schemas.typed), follows its recursion.
JsonValue = TypeAliasType(
    "JsonValue", "None | bool | int | float | str | Sequence[JsonValue] | Mapping[str, JsonValue]")
JsonObject: TypeAlias = dict[str, JsonValue]


def own_codec(kind: type[Any], *, read: Callable[[Any], Any], write: Callable[[Any], Any],
              fields: Any = None, json_schema: JsonObject | None = None) -> Any:
    """pydantic's core schema for a type that reads and writes its JSON itself (``read``
    and ``write``), where it sits inside a document pydantic reads and writes
    (``autotune.schemas.typed``). Its JSON Schema: ``json_schema``, or, where what it
    writes is its fields, theirs (``fields``, their core schema). Imported here, on first
    use: the trial process, which writes these types, runs without pydantic."""
    from pydantic_core import core_schema

    def schema_of(_: Any, handler: Any) -> Any:
        return dict(json_schema) if json_schema is not None else handler(fields)

    return core_schema.no_info_plain_validator_function(
        lambda value: value if isinstance(value, kind) else read(value),
        serialization=core_schema.plain_serializer_function_ser_schema(write),
        metadata={"pydantic_js_functions": [schema_of]})
