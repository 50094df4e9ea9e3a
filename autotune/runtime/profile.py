"""train_tuned.py --profile: one short window of training under torch.profiler, and
where its step goes (``shares.step_shares``).

Warm-up first (at least ``WARM_STEPS`` and ``WARM_S``: compiling, cuDNN's choices and
the DataLoader's workers starting are not the steady step), then about ``WINDOW_S`` of
steps, at least ``MIN_STEPS``, under the profiler. With several ranks every rank takes
the same steps (their collectives must meet) and rank 0 alone is profiled.
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from collections.abc import Callable
from typing import Any

import torch

from .json_value import JsonObject
from .knobs import Device
from .model import check_finite
from .session import Session
from .shares import DATA_WAIT, STEP, WINDOW, ProfilerEvent, ProfilerEventKind, step_shares, table_lines

WARM_STEPS = 3
WARM_S = 1.0
MAX_WARM_STEPS = 200
WINDOW_S = 1.0
MIN_STEPS = 5
MAX_STEPS = 50


def _kind(device_type: Any, is_user_annotation: bool) -> ProfilerEventKind:
    if device_type == torch.autograd.DeviceType.CPU:
        return ProfilerEventKind.CPU
    # the device-side copy of a record_function range (the optimizer's, ours), not work
    return ProfilerEventKind.ANNOTATION if is_user_annotation else ProfilerEventKind.KERNEL


# Ranges the profiler opens around each record_function and a few bookkeeping ops: no work
# of the step's, and left out of torch's own event list too.
_BOOKKEEPING = frozenset({"[memory]", "[OutOfMemory]", "profiler::_record_function_enter",
                          "profiler::_record_function_enter_new", "profiler::_record_function_exit",
                          "aten::is_leaf", "aten::output_nr", "aten::_version"})


def listed_events_of(prof: Any) -> list[ProfilerEvent]:
    """The profiler's events as torch's own event list (``prof.events()``) gives them."""
    return [ProfilerEvent(name=e.name, start=float(e.time_range.start), duration=float(e.time_range.elapsed_us()),
                          kind=_kind(e.device_type, bool(getattr(e, "is_user_annotation", False))),
                          thread=int(e.thread))
            for e in prof.events()]


def events_of(prof: Any) -> list[ProfilerEvent]:
    """The profiler's events as ``ProfilerEvent``s: host ops and ranges, and device work.

    Read from the profiler's raw results: ``prof.events()`` first builds torch's whole
    event tree (shapes, stacks, memory, parents), which for a step that loads its batch
    sample by sample (thousands of small ops a step) takes many times the profiled window
    itself. The fields read here are the ones that list takes from the same results."""
    results = getattr(getattr(prof, "profiler", None), "kineto_results", None)
    if results is None:  # a torch that keeps no raw results
        return listed_events_of(prof)
    origin = results.trace_start_ns()
    names: dict[str, str] = {}  # demangled once per name, as torch's StringTable does
    hidden = getattr(torch._C._autograd._KinetoEvent, "is_hidden_event", None)
    out = []
    for e in results.events():
        raw = e.name()
        if raw in _BOOKKEEPING or (hidden is not None and hidden(e)):
            continue
        name = names.get(raw)
        if name is None:
            name = names[raw] = torch._C._demangle(raw) if len(raw) > 1 else raw
        start_ns = e.start_ns()
        out.append(ProfilerEvent(name=name, start=(start_ns - origin) / 1000.0,
                                 duration=(e.end_ns() - start_ns) / 1000.0,
                                 kind=_kind(e.device_type(), e.is_user_annotation()),
                                 thread=int(e.start_thread_id())))
    return out


def warm_up(session: Session) -> float:
    """Steps until the warm-up is over on every rank; returns the seconds of one steady
    step (those after the first ``WARM_STEPS``), as the slowest rank took them."""
    began = time.perf_counter()
    steady_from, steps, losses = began, 0, []
    while True:
        losses.append(session.step())
        steps += 1
        if steps == WARM_STEPS:
            session.dist.synchronize()
            steady_from = time.perf_counter()
        if steps > WARM_STEPS:
            session.dist.synchronize()
            now = time.perf_counter()
            # agreed: every rank leaves the warm-up after the same step
            if session.dist.agree_max(now - began) >= WARM_S or steps >= MAX_WARM_STEPS:
                check_finite(losses)
                return session.dist.agree_max((now - steady_from) / (steps - WARM_STEPS))


def window(session: Session, steps: int, *, profiled: bool) -> tuple[Any, float]:
    """``steps`` steps, each its data wait and its training, under the profiler where
    ``profiled``; returns the profiler (None where not profiled) and the window's seconds."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if session.dist.device.type == Device.CUDA:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=activities) if profiled else None
    losses = []
    with prof if prof is not None else contextlib.nullcontext(), torch.profiler.record_function(WINDOW):
        began = time.perf_counter()
        for _ in range(steps):
            with torch.profiler.record_function(STEP):
                with torch.profiler.record_function(DATA_WAIT):
                    batch = session.next_batch()
                losses.append(session.train_step(batch))
        session.dist.synchronize()
        seconds = time.perf_counter() - began
    check_finite(losses)
    return prof, seconds


def profiled_window(session: Session, *, warmed: Callable[[], None] | None = None
                    ) -> tuple[JsonObject | None, int, float]:
    """Warm up (``warm_up``), then one window of about ``WINDOW_S`` under the profiler on
    rank 0; ``warmed`` is called between the two. Returns rank 0's profile as
    ``StepShares.to_json`` writes it (None on the other ranks), the window's steps and its
    seconds by the script's own clock."""
    per_step = warm_up(session)
    if warmed is not None:
        warmed()
    steps = min(MAX_STEPS, max(MIN_STEPS, math.ceil(WINDOW_S / max(per_step, 1e-6))))
    steps = int(session.dist.agree_max(float(steps)))
    rank0 = session.dist.rank == 0
    prof, seconds = window(session, steps, profiled=rank0)
    if not rank0:
        return None, steps, seconds
    shares = step_shares(events_of(prof))
    return shares.to_json(device=session.dist.device.type, measured_step_ms=seconds * 1000.0 / steps), steps, seconds


def run(session: Session, *, report: str | None) -> int:
    """Warm up, profile one window, print where its step goes and write it into
    ``report`` (as ``"step_profile"``); returns the exit code."""
    profile, steps, _ = profiled_window(session)
    if profile is None:
        return 0
    for line in table_lines(profile):
        print(line, flush=True)
    if report:
        with open(report, "w") as f:
            json.dump({"steps": steps, "step_profile": profile}, f)
    return 0
