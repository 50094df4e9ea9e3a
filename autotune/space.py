"""The search space: which knobs exist on this machine, and why the others do not.

Built from the machine probe (``probes``) and the model file (``Task``); every value
the search skips comes with its reason, shown by ``autotune probe`` and ``run``.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from autotune.config import TrialConfig
from autotune.errors import UsageError

# Knobs the user may pin with --fix, with how to read their value.
_BOOL = {"true": True, "1": True, "yes": True, "on": True,
         "false": False, "0": False, "no": False, "off": False}


def _parse_value(field: dataclasses.Field, text: str) -> Any:
    kind = str(field.type)
    if text.lower() in ("none", "default") and "None" in kind:
        return None
    try:
        if kind.startswith("int"):
            return int(text)
        if kind.startswith("float"):
            return float(text)
        if kind.startswith("bool"):
            return _BOOL[text.lower()]
    except (ValueError, KeyError):
        raise UsageError(f"--fix {field.name}={text}: expected {kind.replace(' | None', '')}") from None
    return text


def parse_fixes(items: list[str]) -> dict[str, Any]:
    """``["batch_size=64", "precision=fp32"]`` -> typed values; unknown knobs are errors."""
    fields = {f.name: f for f in dataclasses.fields(TrialConfig)}
    fixed: dict[str, Any] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(f"--fix {item!r}: expected KNOB=VALUE, e.g. --fix batch_size=64")
        if name not in fields:
            raise UsageError(
                f"--fix {name}: unknown knob. Knobs: {', '.join(sorted(fields))}"
            )
        fixed[name] = _parse_value(fields[name], text.strip())
    try:
        TrialConfig(**{"batch_size": 1 * fixed.get("nprocs", 1), **fixed})
    except UsageError as exc:
        raise UsageError(f"--fix: {exc}") from None
    return fixed


def _powers_of_two_around(base: int, *, below: int = 2, above: int = 3) -> list[int]:
    """base itself plus powers of two from base/2**below to base*2**above."""
    p = 2 ** round(math.log2(base))
    values = {base} | {int(p * 2.0**k) for k in range(-below, above + 1)}
    return sorted(v for v in values if v >= 1)


@dataclasses.dataclass
class Space:
    """Values per knob on this machine; ``excluded`` holds "knob[=value]" -> reason."""

    choices: dict[str, list[Any]]
    excluded: dict[str, str]
    baseline: TrialConfig
    fixed: dict[str, Any]

    @property
    def layouts(self) -> list[tuple[int, int]]:
        return [tuple(map(int, s.split("x"))) for s in self.choices["layout"]]

    def suggest(self, trial: Any) -> TrialConfig:
        """Ask an Optuna trial for every searched knob; pinned knobs stay pinned."""
        params: dict[str, Any] = {}
        for name, values in self.choices.items():
            params[name] = values[0] if len(values) == 1 else trial.suggest_categorical(name, values)
        return self.config_from_params(params)

    def config_from_params(self, params: Mapping[str, Any]) -> TrialConfig:
        values = dict(params)
        nprocs, threads = map(int, values.pop("layout").split("x"))
        base = self.baseline.to_dict()
        base.update(values)
        base.update(nprocs=nprocs, threads=threads)
        # Workers re-spawned every epoch are pure overhead in a long training run.
        base["persistent_workers"] = base["num_workers"] > 0
        base.update(self.fixed)
        return TrialConfig(**base)

    def params_of(self, cfg: TrialConfig) -> dict[str, Any]:
        """The Optuna params that select ``cfg`` (for enqueueing known configurations)."""
        out = {}
        for name, values in self.choices.items():
            value = f"{cfg.nprocs}x{cfg.threads}" if name == "layout" else getattr(cfg, name)
            if value not in values:
                raise ValueError(f"{name}={value!r} is outside the space {values}")
            out[name] = value
        return out

    def describe(self) -> dict[str, Any]:
        return {
            "included": {k: v for k, v in self.choices.items()},
            "fixed": dict(self.fixed),
            "excluded": dict(self.excluded),
        }


def build_space(
    machine: Mapping[str, Any],
    *,
    baseline_batch: int = 32,
    dataset_len: int | None = None,
    image_inputs: bool = False,
    fixed: Mapping[str, Any] | None = None,
) -> Space:
    fixed = dict(fixed or {})
    cpu = machine.get("cpu") or {}
    cores = int(cpu.get("usable_cores") or 1)
    isa = cpu.get("isa") or {}
    gpus = machine.get("gpus") or []
    excluded: dict[str, str] = {}
    choices: dict[str, list[Any]] = {}

    # Process layout: ranks x threads within the usable cores.
    layouts = [f"{n}x{t}" for n in range(1, cores + 1) for t in range(1, cores // n + 1)
               if n * t <= cores]
    backends = machine.get("backends") or {"gloo": True}
    if not backends.get("gloo"):
        layouts = [s for s in layouts if s.startswith("1x")]
        excluded["nprocs>1"] = "the gloo backend did not initialise on this machine"
    if cores == 1:
        excluded["nprocs>1"] = "only one usable core"
    if "nprocs" in fixed:
        layouts = [s for s in layouts if int(s.split("x")[0]) == fixed["nprocs"]]
    if fixed.get("threads") is not None:
        layouts = [s for s in layouts if int(s.split("x")[1]) == fixed["threads"]]
    if not layouts:
        raise UsageError(
            f"--fix nprocs/threads leaves no layout within the {cores} usable cores "
            "(ranks x threads must not exceed them)"
        )
    fixed.pop("nprocs", None)
    fixed.pop("threads", None)
    choices["layout"] = layouts
    max_ranks = max(int(s.split("x")[0]) for s in layouts)

    if "batch_size" in fixed:
        batches = [fixed["batch_size"]]
    else:
        batches = _powers_of_two_around(baseline_batch)
        if dataset_len:
            too_big = [b for b in batches if b > dataset_len]
            if too_big:
                excluded["batch_size>" + str(dataset_len)] = "larger than the dataset"
            batches = [b for b in batches if b <= dataset_len] or [baseline_batch]
    # Every layout must be able to split every batch evenly over its ranks.
    uneven = [b for b in batches if any(b % int(s.split("x")[0]) for s in layouts)]
    if uneven and max_ranks > 1:
        excluded["batch_size=" + ",".join(map(str, uneven))] = (
            "does not split evenly over the ranks of every layout"
        )
        batches = [b for b in batches if b not in uneven] or batches
    choices["batch_size"] = batches

    choices["num_workers"] = list(range(0, min(cores, 4) + 1))

    precisions = ["fp32"]
    if isa.get("avx512_bf16") or isa.get("amx_bf16"):
        precisions.append("bf16")
    else:
        excluded["precision=bf16"] = (
            "CPU has no avx512_bf16/AMX: bf16 autocast would be emulated and about 2x slower"
        )
    if not gpus:
        excluded["precision=fp16"] = "fp16 autocast with GradScaler needs a CUDA GPU"
        excluded["precision=tf32"] = "tf32 needs an Ampere or later NVIDIA GPU"
    choices["precision"] = precisions

    for name in ("batch_size", "num_workers", "precision"):
        if name in fixed:
            choices[name] = [fixed.pop(name)]

    baseline = TrialConfig(batch_size=baseline_batch)
    return Space(choices=choices, excluded=excluded, baseline=baseline, fixed=fixed)
