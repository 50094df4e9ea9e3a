"""``autotune probe``: what this machine offers, and the search space it implies."""
from __future__ import annotations

import argparse
import json

from autotune.space import LATE_KNOBS, MEMORY_KNOBS, build_space


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("probe", help="report the hardware and software autotune sees",
                       description=__doc__)
    p.add_argument("--json", action="store_true", help="print a stable JSON document")
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from autotune.probes import fingerprint_id, probe_machine, render_text

    doc = probe_machine().to_dict()
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
