"""``autotune probe``: what this machine offers, and the search space it implies."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.space import LATE_KNOBS, MEMORY_KNOBS, build_space

if TYPE_CHECKING:
    from pydantic.json_schema import JsonSchemaValue

SCHEMA = Path(__file__).resolve().parent.parent / "schemas" / "probe.schema.json"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("probe", help="report the hardware and software autotune sees",
                       description=__doc__)
    p.add_argument("--json", action="store_true", help="print a stable JSON document")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from autotune.probes import fingerprint_id, probe_machine, render_text

    doc = probe_machine().to_json()
    doc["fingerprint_id"] = fingerprint_id(doc)
    space = build_space(doc)
    doc["space"] = space.describe()
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
        return 0
    print(render_text(doc))
    print("\nsearch space on this machine (for a model with batch_size 32):")
    for knob, values in space.recorded.items():
        when = (" (tried on the best configuration at the end)" if knob in LATE_KNOBS
                else " (tried where a configuration runs out of memory)" if knob in MEMORY_KNOBS
                else " (the default; a run measures how far throughput rises with the batch first, "
                     "and tries larger ones where the model file has evaluate() to check them)"
                if knob == "batch_size" else "")
        print(f"  {knob}: {', '.join(map(str, values))}{when}")
    for knob, reason in space.excluded.items():
        print(f"  not searched: {knob}: {reason}")
    return 0


def probe_schema() -> JsonSchemaValue:
    """The JSON Schema of ``probe --json``, generated from the probe document's types
    (``Machine``) with the two sections this command adds: the machine's fingerprint id and
    the search space it implies (``Space.describe``)."""
    from autotune.probes import Machine
    from autotune.schemas import typed

    machine = typed.schema(Machine)
    properties = {**machine["properties"], "fingerprint_id": {"type": "string"},
                  "space": {"type": "object", "required": ["included", "fixed", "excluded"],
                            "properties": {"included": {"type": "object"}, "fixed": {"type": "object"},
                                           "excluded": {"type": "object",
                                                        "additionalProperties": {"type": "string"}}}}}
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "autotune/probe.schema.json",
            "title": "autotune probe --json",
            "description": "What this machine offers as autotune reads it, its fingerprint, and the search "
                           "space it implies for a model with batch size 32. Generated from the probe "
                           "document's types: python -c 'from autotune.commands.probe import write_schema; "
                           "write_schema()'",
            "type": "object", "required": [*machine.get("required", []), "fingerprint_id", "space"],
            "properties": properties, "$defs": machine.get("$defs", {})}


def write_schema() -> None:
    """Write ``probe_schema()`` over the shipped schema file."""
    SCHEMA.write_text(json.dumps(probe_schema(), indent=1) + "\n")
