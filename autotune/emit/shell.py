"""The lines a launcher script (launch.sh, torchrun.sh) sets a tuned variable with: the
user's own value kept, with a warning, never overridden silently."""
from __future__ import annotations

import shlex

from autotune.runtime import gpu_knobs


def keep_or_export(key: str, value: str, *, script: str, export: str | None = None) -> str:
    """A shell line for a launcher script: a value the user already set is kept, with a
    warning (never overridden silently); else ``export`` (by default ``export KEY=value``)
    runs."""
    q = shlex.quote(value)
    if key == gpu_knobs.ALLOC_CONF:  # merged, not kept or replaced
        return alloc_conf_line(value, script=script)
    export = export or f"export {key}={q}"
    return (f'if [ -n "${{{key}+x}}" ] && [ "${{{key}}}" != {q} ]; then '
            f'echo "{script}: keeping your {key}=${{{key}}} (tuned value: "{q}")" >&2; '
            f"else {export}; fi")


def alloc_conf_line(value: str, *, script: str) -> str:
    """As keep_or_export for the CUDA allocator's options, merged as ``trials.launch.environment`` merges
    them: the user's options kept, expandable segments added unless they name them."""
    key, q = gpu_knobs.ALLOC_CONF, shlex.quote(value)
    option = shlex.quote(gpu_knobs.EXPANDABLE)
    return (f'if [ -z "${{{key}:-}}" ]; then export {key}={q}; else case "${{{key}}}" in '
            f'*expandable_segments*) echo "{script}: keeping your {key}=${{{key}}}" >&2;; '
            f'*) export {key}="${{{key}}}",{option}; '
            f'echo "{script}: added "{option}" to your {key}" >&2;; esac; fi')
