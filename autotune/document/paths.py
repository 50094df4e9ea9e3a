"""Where a written document's files are: its outputs in the folder it was read from, and
the model file it was tuned for."""
from __future__ import annotations

import os
from pathlib import Path

from autotune.document.run import CandidateDocument, RunDocument
from autotune.errors import UsageError


def resolve(doc: RunDocument | CandidateDocument, folder: Path, key: str) -> Path:
    """An output of ``doc`` (``"launcher"``, ``"script"``, ``"config"``) in ``folder``,
    the folder best_config.json was read from (an absolute path, as older documents hold,
    stays as it is)."""
    # set wherever a document was written, and the schema requires it of one read back
    assert doc.outputs is not None, "a document not yet written has no outputs"
    return folder / doc.outputs[key]


def model_file(doc: RunDocument | CandidateDocument, folder: Path, *,
               override: str | os.PathLike[str] | None = None) -> Path:
    """The model file of ``doc``: ``override`` (``--model-file``), else its path relative
    to ``folder`` (a folder moved with the project), else where it was when tuned."""
    if override is not None:
        return Path(override)
    relative = (folder / doc.model_file).resolve()
    if relative.exists():
        return relative
    tuned = Path(doc.model_file_tuned or doc.model_file)
    if tuned.exists():
        return tuned
    raise UsageError(f"the model file is neither at {relative} (relative to {folder}) nor at {tuned} "
                     "(where it was tuned): give it with --model-file")
