"""What a trial's error was (``classify``): out of memory, a compile error, the user's own
code, or another error; the worker reports it as the trial's failure."""
from __future__ import annotations

import os
import traceback

from autotune.trials.protocol import Failure

# What an allocation that found no memory says, where it does not say "out of memory":
# CUDA's libraries name their own status (cuBLAS creating its handle or workspace, cuDNN
# its workspace...), the driver and runtime APIs their error, torch's CPU allocator its
# own words. Each is a configuration that held too much, and must be classified so that
# the memory knobs are tried (search.memory.rescue) and the batch ramp stops as bound by
# memory, not as broken. CUBLAS_STATUS_NOT_INITIALIZED is left out: a full GPU can cause
# it, but so do a driver or library that does not load, which no less memory would fix.
# Compared lowercased.
OUT_OF_MEMORY_MARKERS = (
    "out of memory",  # torch's allocators (CUDA, HIP, MPS, XPU), cudaGetErrorString, NCCL
    "can't allocate memory",  # torch's CPU allocator
    "cuda_error_out_of_memory",  # the driver API's name
    "cudaerrormemoryallocation",  # the runtime API's name
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
    "cudnn_status_internal_error_host_allocation_failed",  # cuDNN 9
    "cudnn_status_internal_error_device_allocation_failed",
    "cusolver_status_alloc_failed",
    "cusparse_status_alloc_failed",
    "cufft_alloc_failed",
    "curand_status_allocation_failed",
)


def classify(exc: BaseException, model_file: str) -> Failure:
    import torch

    from autotune.runtime.model import NonFiniteLoss

    text = f"{type(exc).__module__}.{type(exc).__name__}: {exc}"
    if isinstance(exc, NonFiniteLoss):
        return Failure.NAN_LOSS
    # torch's own error by its type (torch.OutOfMemoryError since 2.5): its message may be
    # a model file's, in words of its own
    if (isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError))
            or any(marker in text.lower() for marker in OUT_OF_MEMORY_MARKERS)):
        return Failure.OUT_OF_MEMORY
    if "torch._dynamo" in text or "torch._inductor" in text or "BackendCompilerFailed" in text:
        return Failure.COMPILE_ERROR
    path = os.path.abspath(model_file)
    frames = traceback.extract_tb(exc.__traceback__)
    if any(os.path.abspath(f.filename) == path for f in frames):
        return Failure.USER_ERROR
    if isinstance(exc, SyntaxError) and exc.filename and os.path.abspath(exc.filename) == path:
        return Failure.USER_ERROR
    obj = getattr(exc, "obj", None) if isinstance(exc, AttributeError) else None
    source = getattr(obj, "__file__", None)
    if source and os.path.abspath(source) == path:
        return Failure.USER_ERROR  # a contract function missing from the user's module
    if f'File "{path}"' in str(exc):  # re-raised from a DataLoader worker, traceback as text
        return Failure.USER_ERROR
    return Failure.ERROR


# How an error the user's script raised is said (``script_fault``): it needs no "the model
# file raised an error" before it (``TrialResult.describe_failure``).
SCRIPT_FAULT = "your script raised "


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def script_fault(exc: BaseException, script: str, step: int | None) -> str:
    """An error the user's script raised, in its words: "your script raised RuntimeError at
    train.py:27 on its 7th training step: ...", then its own frames of the traceback (those in
    the script's folder, outside installed packages). ``step``: the training step it raised on
    (None: before the first)."""
    path = os.path.abspath(script)
    folder = os.path.dirname(path) + os.sep
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if os.path.abspath(f.filename) == path]
    own = [f for f in frames if os.path.abspath(f.filename).startswith(folder) and "site-packages" not in f.filename]
    where = f" at {os.path.basename(path)}:{mine[-1].lineno}" if mine else ""
    when = f" on its {_ordinal(step)} training step" if step is not None else " before its first training step"
    shown = "".join(traceback.format_list(own[-8:])).rstrip()
    return (f"{SCRIPT_FAULT}{type(exc).__name__}{where}{when}: {exc}"
            + (f"\nIts frames (most recent call last):\n{shown}" if shown else ""))
