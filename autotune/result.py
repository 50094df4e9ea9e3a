"""A finished run's result: read back from its ``best_config.json``, as the Python API
returns it and as ``autotune show`` and ``autotune verify`` read it."""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

from autotune import schemas
from autotune.config import TrialConfig
from autotune.document.paths import resolve
from autotune.document.run import RunDocument
from autotune.emit.outputs import CONFIG_NAME, SCHEMA
from autotune.errors import UsageError
from autotune.runtime.json_value import JsonObject


@dataclasses.dataclass(frozen=True)
class Speedup:
    """The verified speedup: the median ratio of the standalone pairs (the emitted
    launch.sh against the baseline's script, each run alone) and the interval a
    re-measurement of as many pairs is expected to land in (``level``); ``lower``: the
    figure a re-measurement stays above with that probability (None in documents from
    before it was printed)."""

    median: float
    low: float
    high: float
    level: float
    pairs: int
    lower: float | None = None

    def __str__(self) -> str:
        within = (f"{self.median:.2f}x over {self.pairs} pairs of standalone runs (a re-run "
                  f"lands in {self.low:.2f}-{self.high:.2f}x, {self.level:.0%})")
        return within if self.lower is None else f"{self.lower:.2f}x or more in {self.level:.0%} of re-runs: {within}"


@dataclasses.dataclass(frozen=True)
class Result:
    """What a run emitted. ``verified`` is False when nothing beat the baseline (then
    ``config`` is the baseline and ``speedup`` is None); ``document`` is the whole of
    best_config.json, as JSON (``autotune.result.read_document`` reads it typed)."""

    verified: bool
    config: TrialConfig
    baseline: TrialConfig
    speedup: Speedup | None
    samples_per_s: float | None
    baseline_samples_per_s: float
    out: Path
    script: Path
    launcher: Path
    document: JsonObject = dataclasses.field(repr=False, compare=False)

    @classmethod
    def from_document(cls, doc: RunDocument, folder: Path) -> Result:
        """``doc`` as read from (or written to) ``folder``: its paths are relative to it."""
        sp = doc.speedup
        speedup = None
        if sp is not None and sp.pairs:
            speedup = Speedup(median=sp.interval.ratio, low=sp.interval.low, high=sp.interval.high,
                              level=sp.interval.level, pairs=sp.pairs, lower=sp.lower_bound)
        return cls(
            verified=doc.verified,
            config=doc.config,
            baseline=doc.baseline.config,
            speedup=speedup,
            samples_per_s=doc.best.samples_per_s if doc.best is not None else None,
            baseline_samples_per_s=doc.baseline.samples_per_s,
            out=folder.absolute(), script=resolve(doc, folder.absolute(), "script"),
            launcher=resolve(doc, folder.absolute(), "launcher"), document=doc.to_json())


def read_document(out: str | os.PathLike[str]) -> RunDocument:
    """best_config.json of an output folder (or the file itself), checked before it is
    read: it exists, is JSON, comes from a schema version this autotune reads, and
    matches the JSON Schema shipped in the package (``autotune/schemas``)."""
    out = Path(out)
    path = out / CONFIG_NAME if out.is_dir() else out
    if not path.exists():
        raise UsageError(f"{path}: no such file. Give the output folder of an `autotune run`.")
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not valid JSON ({exc}).") from None
    if not isinstance(doc, dict) or "config" not in doc:
        raise UsageError(f"{path}: not a result of `autotune run` (no \"config\").")
    version = doc.get("schema", SCHEMA)
    if not isinstance(version, int) or version > SCHEMA:
        raise UsageError(f"{path}: written by a newer autotune (schema {version!r}, this "
                         f"version reads {SCHEMA}): upgrade autotune to read it.")
    broken = schemas.problem(doc, "best_config")
    if broken is None:
        try:
            return RunDocument.from_json(doc)
        except KeyError as exc:  # a part the schema leaves optional (older documents lack it)
            broken = f"{exc} is missing"
        except (TypeError, ValueError, UsageError) as exc:
            broken = str(exc)
    raise UsageError(f"{path}: not a valid autotune result: {broken}. "
                     "Was it edited by hand? Run `autotune run` again to write it afresh.")


def load(out: str | os.PathLike[str]) -> Result:
    """The result of an earlier run, read back from its outputs.

    Args:
        out: The run's output folder, or its best_config.json.

    Returns:
        The ``Result`` that ``autotune.tune`` returned for that run.

    Raises:
        autotune.UsageError: There is no best_config.json there, or it is not a result
            autotune can read (not JSON, not a run's result, from a newer autotune, or
            not matching the JSON Schema).
    """
    out = Path(out)
    return Result.from_document(read_document(out), out if out.is_dir() else out.parent)
