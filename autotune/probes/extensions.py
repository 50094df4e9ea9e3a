"""Torch's extensions: oneCCL's bindings (the ccl backend) and IPEX, each asked in a child
interpreter (``probes.child``); the common "not installed" cases are answered from package
metadata without starting a process."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from . import _io
from .child import LOOPBACK_ENV, child_failure, child_python_argv

EXTENSION_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class IpexStatus:
    """The probe document's ipex section: whether intel-extension-for-pytorch is installed
    and imports against this torch, and why not when it does not."""

    installed: bool = False
    compatible: bool = False
    version: str | None = None
    reason: str | None = None


CCL_PROBE_SCRIPT = r"""
import torch, oneccl_bindings_for_pytorch
import torch.distributed as dist
print("ccl" in [str(b).lower() for b in dist.Backend.backend_list])
"""

IPEX_PROBE_SCRIPT = r"""
import intel_extension_for_pytorch as ipex
print(ipex.__version__)
"""


def probe_ccl(
    *, run: _io.Runner = subprocess.run, find_spec: Callable[[str], Any] = importlib.util.find_spec
) -> tuple[bool, str | None]:
    """(usable, reason).  Import-only: a 1-rank oneCCL group would need its
    own KVS and transport configured to stay on loopback."""
    if _safe_find_spec(find_spec, "oneccl_bindings_for_pytorch") is None:
        return False, "oneccl_bindings_for_pytorch not installed"
    rc, out, err = _io.run_text(
        child_python_argv(CCL_PROBE_SCRIPT), run=run, timeout=EXTENSION_TIMEOUT_S, env={**os.environ, **LOOPBACK_ENV}
    )
    if rc == 0 and out.strip().endswith("True"):
        return True, None
    if rc == 0:
        return False, "oneccl_bindings_for_pytorch imported but did not register the ccl backend"
    return False, child_failure(rc, err or out) or "import failed"


def probe_ipex(
    *,
    run: _io.Runner = subprocess.run,
    find_spec: Callable[[str], Any] = importlib.util.find_spec,
    version_of: Callable[[str], str] = importlib.metadata.version,
) -> IpexStatus:
    """Never imported here: a mismatched IPEX prints an error and calls
    exit() on import, which would take the caller down with it."""
    if _safe_find_spec(find_spec, "intel_extension_for_pytorch") is None:
        return IpexStatus(installed=False, compatible=False, version=None, reason="not installed")
    version = None
    for dist_name in ("intel_extension_for_pytorch", "intel-extension-for-pytorch"):
        try:
            version = version_of(dist_name)
            break
        except Exception:
            continue
    rc, out, err = _io.run_text(child_python_argv(IPEX_PROBE_SCRIPT), run=run, timeout=EXTENSION_TIMEOUT_S)
    if rc == 0:
        return IpexStatus(installed=True, compatible=True, version=_io.last_line(out) or version, reason=None)
    # IPEX's own mismatch message goes to stdout or stderr depending on version.
    reason = _io.last_line(err) or _io.last_line(out) or f"import exited with {rc}"
    return IpexStatus(installed=True, compatible=False, version=version, reason=reason)


def _safe_find_spec(find_spec: Callable[[str], Any], name: str) -> Any:
    try:
        return find_spec(name)
    except (ImportError, ValueError):
        return None
