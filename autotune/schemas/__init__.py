"""The JSON Schemas of what autotune writes and prints: ``best_config.json`` (also what
``run --json`` and ``show --json`` print), ``probe --json``, and an error under ``--json``.
Shipped in the package, so a user's tooling can validate against the same files."""
from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from autotune.runtime.json_value import JsonObject

HERE = Path(__file__).parent
NAMES = ("best_config", "probe", "error")


@functools.cache
def load(name: str) -> JsonObject:
    if name not in NAMES:
        raise ValueError(f"no schema {name!r}; the schemas are {', '.join(NAMES)}")
    return json.loads((HERE / f"{name}.schema.json").read_text())


def problem(doc: Any, name: str) -> str | None:
    """Where ``doc`` breaks schema ``name`` and how, in one line; None when it conforms."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(load(name))
    error = jsonschema.exceptions.best_match(validator.iter_errors(doc))
    if error is None:
        return None
    # a part that may be null (absent where it did not happen) breaks as the part: say where in it
    while error.context and (inside := [e for e in error.context if e.validator_value != "null"]):
        error = jsonschema.exceptions.best_match(inside)
    where = ".".join(str(p) for p in error.absolute_path) or "the top level"
    return f"at {where}, {error.message}"
