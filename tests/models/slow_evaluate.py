"""tests/models/slow_loading.py (its data set takes as long to load a batch as the model takes
to train on it, so a candidate with DataLoader workers is clearly faster and verification
settles at its fewest rounds and pairs) with an evaluate() that takes seconds
(AUTOTUNE_TEST_EVALUATE_S, default 2 s a call): a model file that scores a validation set."""
import importlib.util
import os
import time
from pathlib import Path

import torch

# the model file is imported by its path: its sibling is loaded the same way
_spec = importlib.util.spec_from_file_location("slow_loading", Path(__file__).with_name("slow_loading.py"))
assert _spec is not None and _spec.loader is not None
_loading = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_loading)

batch_size = _loading.batch_size
build_model, build_dataset, build_optimizer = _loading.build_model, _loading.build_dataset, _loading.build_optimizer
EVALUATE_S = float(os.environ.get("AUTOTUNE_TEST_EVALUATE_S", "2"))


def evaluate(model):
    """1.0 while the model's outputs are finite: what matters here is its time, not its score
    (every batch the search tries trains as well by it)."""
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1)).to(next(model.parameters()).device)
    with torch.no_grad():
        finite = bool(model(x).isfinite().all())
    time.sleep(EVALUATE_S)
    return float(finite)
