"""How long the step profile takes to read and divide one profiled window: the profiler's
raw results (``runtime.profile.events_of``) against torch's own event list
(``listed_events_of``), alternating, each on a fresh window of its own.

    python bench/profile_events.py --pairs 6

The window is 15 steps of a small CNN whose batch of 512 the DataLoader gathers sample by
sample, as tests/models/tiny_cnn.py's does at the batch the search picks: thousands of small
ops a step, which is what makes torch's event list slow to build.
"""
from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from autotune.runtime.profile import events_of, listed_events_of
from autotune.runtime.shares import DATA_WAIT, STEP, WINDOW, ProfilerEvent, step_shares

STEPS = 15


def profiled_window(batch: int) -> Any:
    data = torch.utils.data.TensorDataset(torch.randn(8192, 1, 28, 28), torch.randint(0, 10, (8192,)))
    model = torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                torch.nn.Linear(8 * 26 * 26, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = iter(torch.utils.data.DataLoader(data, batch_size=batch))
    profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    with profiler as prof, torch.profiler.record_function(WINDOW):
        for _ in range(STEPS):
            with torch.profiler.record_function(STEP):
                with torch.profiler.record_function(DATA_WAIT):
                    x, y = next(batches)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
    return prof


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--batch", type=int, default=512)
    args = parser.parse_args()
    readers: dict[str, Callable[[Any], list[ProfilerEvent]]] = {"raw": events_of, "listed": listed_events_of}
    seconds: dict[str, list[float]] = {name: [] for name in readers}
    events = 0
    for i in range(args.pairs):
        for name in (("raw", "listed") if i % 2 == 0 else ("listed", "raw")):
            prof = profiled_window(args.batch)
            began = time.perf_counter()
            read = readers[name](prof)
            step_shares(read)
            seconds[name].append(time.perf_counter() - began)
            events = len(read)
    ratios = sorted(listed / raw for listed, raw in zip(seconds["listed"], seconds["raw"]))
    for name, taken in seconds.items():
        print(f"{name:6s} median {statistics.median(taken):.3f} s ({min(taken):.3f}-{max(taken):.3f})")
    print(f"{events} events a window; torch's list over the raw results: median {statistics.median(ratios):.1f}x "
          f"({ratios[0]:.1f}-{ratios[-1]:.1f}x) over {len(ratios)} pairs")


if __name__ == "__main__":
    main()
