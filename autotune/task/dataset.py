"""The model file's dataset, checked in the contract's child process (``task.check``): a
map-style dataset or a stream (an IterableDataset), with at least one full batch of items
the default step can unpack."""
from __future__ import annotations

import itertools
from typing import Any

from autotune.errors import ContractError
from autotune.user_file import UserFile

# An IterableDataset without a length is read this many of the user's batches far: past
# the largest batch size the search tries (8x the user's, rounded to a power of two),
# so a shorter stream caps the batch sizes and a longer one (or an endless one) needs no cap.
STREAM_LOOKAHEAD_BATCHES = 16


def _is_nested_tensors(obj: Any) -> bool:
    """True for a tensor or number, or a list, tuple or dict of them (at any depth):
    what default_collate can stack and the runtime can move to a device."""
    import torch

    if isinstance(obj, (torch.Tensor, int, float, bool)):
        return True
    if isinstance(obj, dict):
        return all(_is_nested_tensors(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return all(_is_nested_tensors(v) for v in obj)
    return False


def is_stream(dataset: Any) -> bool:
    import torch

    return isinstance(dataset, torch.utils.data.IterableDataset)


def check_dataset(file: UserFile, module: Any) -> Any:
    """build_dataset() runs and returns a map-style dataset or an IterableDataset."""
    dataset = file.call("build_dataset()", module.build_dataset)
    # A plain list/tuple/dict is not a Dataset (the contract asks for one; a dict "works"
    # only by accident of its keys); nor is a generator, which one epoch would use up.
    if is_stream(dataset):
        return dataset
    if isinstance(dataset, (list, tuple, dict)) or not (
        hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")
    ):
        raise ContractError(
            f"{file.shown}: build_dataset() returned {type(dataset).__name__}; expected a map-style "
            "torch.utils.data.Dataset (with __len__ and __getitem__), e.g. a TensorDataset, or a "
            "torch.utils.data.IterableDataset."
        )
    return dataset


def check_stream(file: UserFile, dataset: Any, batch_size: int) -> tuple[list[Any], int | None]:
    """An IterableDataset's first two items and its length: len() where it has one, else
    the items counted up to STREAM_LOOKAHEAD_BATCHES batches (None: the stream is longer)."""
    sized = hasattr(type(dataset), "__len__")
    n = check_dataset_len(file, file.call("len(build_dataset())", len, dataset), batch_size) if sized else None
    limit = 2 if sized else batch_size * STREAM_LOOKAHEAD_BATCHES
    items = file.call("iterating over build_dataset()",
                      lambda: list(itertools.islice(iter(dataset), limit)))
    if len(items) < 2:
        raise ContractError(
            f"{file.shown}: iterating over build_dataset() gave {len(items)} item(s); need at least 2."
        )
    if not sized and len(items) < limit:
        n = check_dataset_len(file, len(items), batch_size)
    return items[:2], n


def check_dataset_len(file: UserFile, n: int, batch_size: int) -> int:
    """The dataset's length: at least 2 items (the check's batch) and one full batch."""
    if n < 2:
        raise ContractError(f"{file.shown}: build_dataset() returned a dataset of {n} items; need at least 2.")
    if n < batch_size:
        # Every epoch drops its ragged last batch: no batch of batch_size would ever run.
        raise ContractError(
            f"{file.shown}: build_dataset() returned {n} items, fewer than batch_size = {batch_size}; "
            "expected at least one full batch. Lower batch_size or return more items."
        )
    return n


def check_item_is_pair(file: UserFile, item: Any) -> None:
    """Without a training_step, an item is an (inputs, targets) pair of tensors (or
    nested tuples/lists/dicts of them): the default step unpacks it that way."""
    if not (isinstance(item, (tuple, list)) and len(item) == 2):
        raise ContractError(
            f"{file.shown}: build_dataset()[0] is a {type(item).__name__}"
            + (f" of {len(item)} elements" if isinstance(item, (tuple, list)) else "")
            + "; expected an (inputs, targets) pair. Return `(inputs, targets)` from "
            "__getitem__, or define training_step(model, batch) for another layout."
        )
    if not _is_nested_tensors(item[0]) or not _is_nested_tensors(item[1]):
        raise ContractError(
            f"{file.shown}: build_dataset()[0] holds {type(item[0]).__name__} inputs and "
            f"{type(item[1]).__name__} targets; expected tensors (or tuples/lists/dicts of them)."
        )
