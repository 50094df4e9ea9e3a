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
