"""What a JSON document holds, as a type. The writers of the files and events autotune
produces build ``JsonObject``s, so the type check proves each value is one ``json.dumps``
writes (a dataclass or a path left in by mistake is an error, not a crash at write time).
Readers turn a document back into a dataclass of their own; nothing reads a
``JsonObject`` by key across modules."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TypeAlias

# Sequence and Mapping, not list and dict: they are covariant, so a list[float] or a
# dict[str, int] field is a JSON value as it stands.
JsonValue: TypeAlias = None | bool | int | float | str | Sequence["JsonValue"] | Mapping[str, "JsonValue"]
JsonObject: TypeAlias = dict[str, JsonValue]
