"""Does a trial forked from a warm interpreter measure what a fresh one does? For each
workload and each kind of configuration, one trial forked from the warm interpreter of its
environment (``autotune.trials.forkserver``) and one started fresh (``python -m
autotune.trials.worker``), each a process of its own (never a warm process that ran
another configuration before), alternating which goes first, pair after pair:

    forked/fresh  the paired ratio of their rates, median over pairs, with its interval

and the median time from start to the model file's setup, each way (what the fork saves).
A kind whose interval excludes 1.0 is biased by the fork: give it fresh processes
(``TrialRunner._forked``).

    python bench/fork_bias.py --workloads tiny_lm cifar_cnn --pairs 6
    python bench/fork_bias.py --workloads fashion_cnn --kinds default tcmalloc --pairs 10
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import TrialConfig
from autotune.probes import probe_machine
from autotune.runtime.knobs import Allocator, Backend, CompileMode, Device, Precision
from autotune.task import load_task
from autotune.trials.runner import Measurement, TrialRunner
from autotune.verify import stats

WORKLOADS = ROOT / "bench" / "workloads"
KINDS = ("default", "1 thread", "2 workers", "tcmalloc", "jemalloc", "bf16", "compile", "cuda")


def model_path(name: str) -> Path:
    for folder in (WORKLOADS, ROOT / "examples"):
        path = folder / f"{name}.py"
        if path.exists():
            return path
    raise SystemExit(f"no workload {name!r} in {WORKLOADS} or examples/")


def configurations(batch: int, machine, kinds: list[str]) -> dict[str, TrialConfig]:
    """One configuration per kind of process the fork could change: the environment
    (threads, an allocator's preload), DataLoader workers forked from a forked process,
    16-bit kernels, a compile (its caches), a GPU (its context, made after the fork)."""
    gpu = bool(machine.gpus)
    base = TrialConfig(batch_size=batch, device=Device.CUDA if gpu else Device.CPU,
                       backend=Backend.NCCL if gpu else Backend.GLOO)
    isa = machine.cpu.isa or {}
    cfgs = {"default": base, "1 thread": base.replace(threads=1),
            "2 workers": base.replace(num_workers=2, persistent_workers=True)}
    for allocator in (Allocator.TCMALLOC, Allocator.JEMALLOC):
        if machine.allocators.get(allocator):
            cfgs[allocator.value] = base.replace(allocator=allocator)
    if gpu or isa.get("avx512_bf16") or isa.get("amx_bf16"):
        cfgs["bf16"] = base.replace(precision=Precision.BF16)
    cfgs["compile"] = base.replace(compile=CompileMode.DEFAULT)
    if gpu:
        cfgs["cuda"] = base
    return {k: v for k, v in cfgs.items() if k in kinds}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=["tiny_lm", "cifar_cnn", "fashion_cnn"])
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS)
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--window", type=float, default=1.0, help="seconds a measured window")
    p.add_argument("--out", type=Path, default=Path("bench-out/fork_bias.json"))
    args = p.parse_args()
    machine = probe_machine()
    report: dict[str, dict] = {}
    for name in args.workloads:
        path = model_path(name)
        task = load_task(path)
        cfgs = configurations(task.batch_size, machine, args.kinds)
        work = Path(tempfile.mkdtemp(prefix=f"fork-bias-{name}-"))
        runners = {kind: TrialRunner(model_file=path, machine=machine, workdir=work / kind, warm=False,
                                     measurement=Measurement(window_s=args.window), fork=kind == "forked")
                   for kind in ("fresh", "forked")}
        values: dict[str, dict[str, list[float]]] = {c: {"fresh": [], "forked": []} for c in cfgs}
        starts: dict[str, list[float]] = {"fresh": [], "forked": []}
        try:
            for pair in range(args.pairs):
                for i, (label, cfg) in enumerate(cfgs.items()):
                    kinds = ("fresh", "forked") if (pair + i) % 2 == 0 else ("forked", "fresh")
                    for kind in kinds:
                        res = runners[kind].run(cfg, name=f"{pair}-{label.replace(' ', '_')}")
                        if res.value is None:
                            raise SystemExit(f"{name} {label} ({kind}) failed: {res.describe_failure()}")
                        values[label][kind].append(res.value)
                        starts[kind].append(res.phases.get("start_import_s", 0.0) + res.phases.get("setup_s", 0.0))
                print(f"{name} pair {pair + 1}: " + ", ".join(
                    f"{label} {v['forked'][-1] / v['fresh'][-1]:.3f}" for label, v in values.items()), flush=True)
        finally:
            for runner in runners.values():
                runner.shutdown()
        ratios = {label: stats.ratio_interval([a / b for a, b in zip(v["forked"], v["fresh"])])
                  for label, v in values.items()}
        report[name] = {
            "configs": {label: cfg.short() for label, cfg in cfgs.items()},
            "forked_over_fresh": {label: {"median": round(r.ratio, 3), "ci_low": round(r.low, 3),
                                          "ci_high": round(r.high, 3), "ci_level": r.level,
                                          "biased": not r.low <= 1.0 <= r.high}
                                  for label, r in ratios.items()},
            "start_to_setup_s": {k: round(statistics.median(v), 2) for k, v in starts.items() if v},
            "values": values,
        }
        print(json.dumps({k: v for k, v in report[name].items() if k != "values"}, indent=1), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"machine": machine.cpu.model,
                                    "workloads": report}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
