"""torch.compile's C++ toolchain: the compiler inductor would run, and whether it builds
an OpenMP + Python.h shared object here."""
from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from . import _io

COMPILE_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class CompilerCheck:
    """The probe document's compile section: whether torch.compile can build its kernels
    here, with the compiler it would run, and why not when it cannot."""

    available: bool = False
    compiler: str | None = None
    reason: str | None = None


CXX_PROBE_SOURCE = r"""
#include <Python.h>
#include <omp.h>
extern "C" int probe_sum(int n) {
  int s = 0;
#pragma omp parallel for reduction(+:s)
  for (int i = 0; i < n; ++i) s += i;
  return s + omp_get_max_threads() * 0;
}
"""


def choose_compiler(env: Mapping[str, str], which: Callable[[str], str | None]) -> tuple[str | None, str | None]:
    """(compiler path, reason it can't serve torch.compile or None).  Pure
    given ``which``.

    Inductor on Linux runs exactly $CXX, else g++ (torch/_inductor/config.py
    cpp.cxx), with no further search: a c++ or clang++ that merely exists is
    reported, but with a reason, because torch.compile will not find it.
    """
    cxx = env.get("CXX")
    if cxx:
        path = which(cxx)
        if path:
            return path, None
        fallback = next((p for p in (which(n) for n in ("g++", "c++", "clang++")) if p), None)
        return fallback, f"CXX={cxx} not found; torch.compile uses $CXX and will fail"
    gxx = which("g++")
    if gxx:
        return gxx, None
    other = next((p for p in (which(n) for n in ("c++", "clang++")) if p), None)
    if other:
        return other, f"g++ not found; torch.compile looks only for $CXX or g++ (set CXX={other})"
    return None, "no C++ compiler found ($CXX, g++, c++, clang++)"


def compile_command(compiler: str, source: str, output: str, *, python_include: str | None) -> list[str]:
    """Mirrors what inductor's C++ kernels need: C++17, a shared object,
    OpenMP (-fopenmp, gomp) and Python.h (kernels are Python extensions)."""
    argv = [compiler, "-std=c++17", "-O0", "-shared", "-fPIC", "-fopenmp"]
    if python_include:
        argv.append(f"-I{python_include}")
    return argv + [source, "-o", output, "-lgomp"]


def check_compiler(
    *,
    run: _io.Runner = subprocess.run,
    env: Mapping[str, str] | None = None,
    which: Callable[[str], str | None] = shutil.which,
    timeout: float = COMPILE_TIMEOUT_S,
) -> CompilerCheck:
    """Can torch.compile build CPU kernels here?  Actually compiles a tiny
    OpenMP + Python.h shared object, since a compiler binary alone says
    nothing about missing headers or libgomp."""
    env = dict(os.environ if env is None else env)
    compiler, reason = choose_compiler(env, which)
    if compiler is None or reason is not None:
        return CompilerCheck(available=False, compiler=compiler, reason=reason)
    include = sysconfig.get_paths().get("include")
    if not include or not os.path.exists(os.path.join(include, "Python.h")):
        return CompilerCheck(available=False, compiler=compiler,
                             reason=f"Python.h not found in {include} (install the python dev headers)")
    with tempfile.TemporaryDirectory(prefix="autotune-cxx-") as tmp:
        source = os.path.join(tmp, "probe.cpp")
        with open(source, "w", encoding="utf-8") as fh:
            fh.write(CXX_PROBE_SOURCE)
        argv = compile_command(compiler, source, os.path.join(tmp, "probe.so"), python_include=include)
        rc, out, err = _io.run_text(argv, run=run, timeout=timeout, cwd=tmp)
    if rc == 0:
        return CompilerCheck(available=True, compiler=compiler, reason=None)
    detail = _first_error_line(err or out) or (f"exit status {rc}" if rc is not None else "did not finish")
    return CompilerCheck(available=False, compiler=compiler, reason=f"test compile failed: {detail}")


def _first_error_line(text: str) -> str:
    for line in text.splitlines():
        if "error" in line.lower():
            return line.strip()[:300]
    return _io.last_line(text)
