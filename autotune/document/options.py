"""The options a run was given, as best_config.json records them (``"options"``): every
field of ``RunOptions`` by its name, read from the fields themselves, so that an option
added there is recorded with no code here. A secret (``Flag.secret``: the shared study's
database URL, with its password) is left out."""
from __future__ import annotations

import dataclasses
import json

from autotune.options import RunOptions, flag_of
from autotune.runtime.json_value import JsonObject


def options_record(options: RunOptions) -> JsonObject:
    """``options`` as JSON values (a tuple as a list, a vocabulary's member as its value)."""
    record = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)
              if not ((flag := flag_of(f)) is not None and flag.secret)}
    # through JSON and back: the document read back from the file equals the one written
    return dict(json.loads(json.dumps(record, default=str)))
