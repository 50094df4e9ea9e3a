"""Do warm trials measure what fresh ones measure? For each workload, configurations that
share their process knobs (so a warm process may run them one after another) are
measured both ways, alternating, round after round:

  fresh  each configuration in a new process (``TrialRunner(warm=False)``)
  warm   each in the one warm process that ran the others before it

Printed per configuration: the median over rounds of warm/fresh (paired within a round,
seconds apart) with its distribution-free interval; and per kind the median trial wall
time and overhead (wall time less the measured windows).

    python bench/warm_bias.py --workloads wide_mlp cifar_cnn --rounds 4
    python bench/warm_bias.py --workloads fashion_cnn --configs 'user batch' '4x batch' --rounds 10
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
from autotune.runtime.knobs import Allocator
from autotune.task import load_task
from autotune.trials import runner as runner_module
from autotune.trials.runner import Measurement, TrialRunner
from autotune.verify import stats

WORKLOADS = ROOT / "bench" / "workloads"


def model_path(name: str) -> Path:
    for folder in (WORKLOADS, ROOT / "examples"):
        path = folder / f"{name}.py"
        if path.exists():
            return path
    raise SystemExit(f"no workload {name!r} in {WORKLOADS} or examples/")


def configurations(batch: int, *, images: bool, cores: int, allocator: Allocator) -> dict[str, TrialConfig]:
    """In-process variants of one process (all cores in one process): what a warm process
    runs one after another in a search."""
    base = TrialConfig(threads=cores, batch_size=batch, allocator=allocator)
    cfgs = {"user batch": base, "4x batch": base.replace(batch_size=4 * batch),
            "2 workers": base.replace(num_workers=2, persistent_workers=True),
            "bf16 4x batch": base.replace(batch_size=4 * batch, precision="bf16")}
    if images:
        cfgs["channels_last"] = base.replace(channels_last=True)
    return cfgs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+",
                   default=["tiny_lm", "cifar_cnn", "fashion_cnn", "pipeline_bound", "wide_mlp"])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--configs", nargs="+", metavar="LABEL",
                   help="only these configurations (labels as printed, e.g. 'user batch' '4x batch')")
    p.add_argument("--allocator", default="default", choices=["default", "tcmalloc", "jemalloc"],
                   help="every configuration's allocator (default: glibc's)")
    p.add_argument("--warm-as-before", action="store_true",
                   help="a warm process for every batch size and allocator, glibc's included, as "
                        "warm trials first ran (autotune now gives a batch size and glibc's "
                        "configurations processes of their own: this measures the bias that avoids)")
    p.add_argument("--out", type=Path, default=Path("bench-out/warm_bias.json"))
    args = p.parse_args()
    if args.warm_as_before:
        runner_module.process_key = lambda cfg: json.dumps(
            {k: getattr(cfg, k) for k in runner_module.PROCESS_KNOBS if k != "batch_size"}, sort_keys=True)
    machine = probe_machine()
    cores = int(machine.cpu.usable_cores or 1)
    report: dict[str, dict] = {}
    for name in args.workloads:
        path = model_path(name)
        task = load_task(path)
        cfgs = configurations(task.batch_size, images=task.image_inputs, cores=cores,
                              allocator=Allocator(args.allocator))
        if args.configs:
            unknown = set(args.configs) - set(cfgs)
            if unknown:
                raise SystemExit(f"--configs: no {sorted(unknown)} for {name}; there are {sorted(cfgs)}")
            cfgs = {label: cfg for label, cfg in cfgs.items() if label in args.configs}
        work = Path(tempfile.mkdtemp(prefix=f"warm-bias-{name}-"))
        runners = {kind: TrialRunner(model_file=path, machine=machine, workdir=work / kind,
                                     measurement=Measurement(), warm=kind == "warm")
                   for kind in ("fresh", "warm")}
        values: dict[str, dict[str, list[float]]] = {c: {"fresh": [], "warm": []} for c in cfgs}
        faults: dict[str, dict[str, list[float]]] = {c: {"fresh": [], "warm": []} for c in cfgs}
        phases: dict[str, list[dict[str, float]]] = {"fresh": [], "warm": []}
        try:
            for r in range(args.rounds):
                order = list(cfgs)[r % len(cfgs):] + list(cfgs)[:r % len(cfgs)]
                for i, label in enumerate(order):
                    kinds = ("fresh", "warm") if (r + i) % 2 == 0 else ("warm", "fresh")
                    for kind in kinds:
                        res = runners[kind].run(cfgs[label], name=f"{r}-{label.replace(' ', '_')}")
                        if res.value is None:
                            raise SystemExit(f"{name} {label} ({kind}) failed: {res.describe_failure()}")
                        values[label][kind].append(res.value)
                        counted = res.done.minor_faults_per_step if res.done is not None else None
                        faults[label][kind].append(counted if counted is not None else float("nan"))
                        warm = res.setup is not None and res.setup.warm
                        if kind == "fresh" or warm:  # a warm process's first trial is fresh
                            phases[kind].append(res.phases)
                print(f"{name} round {r + 1}: " + ", ".join(
                    f"{label} {v['warm'][-1] / v['fresh'][-1]:.3f} (faults a step: warm "
                    f"{faults[label]['warm'][-1]:.0f}, fresh {faults[label]['fresh'][-1]:.0f})"
                    for label, v in values.items()), flush=True)
        finally:
            runners["warm"].close()
        ratios = {label: stats.ratio_interval([w / f for w, f in zip(v["warm"], v["fresh"])],
                                              confidence=0.9).to_json()
                  for label, v in values.items()}
        everything = [w / f for v in values.values() for w, f in zip(v["warm"], v["fresh"])]
        report[name] = {
            "configs": {label: cfg.short() for label, cfg in cfgs.items()},
            "warm_over_fresh": {label: {k: round(float(x), 3) for k, x in ri.items() if isinstance(x, (int, float))}
                                for label, ri in ratios.items()},
            "all_configs": {k: round(float(x), 3)
                            for k, x in stats.ratio_interval(everything, confidence=0.9).to_json().items()
                            if isinstance(x, (int, float))},
            "trial_wall_s": {k: round(statistics.median(ph["overhead_s"] + ph["measure_s"] for ph in v), 2)
                             for k, v in phases.items() if v},
            "overhead_s": {k: round(statistics.median(ph["overhead_s"] for ph in v), 2)
                           for k, v in phases.items() if v},
            "minor_faults_per_step": {label: {k: round(statistics.median(x)) for k, x in v.items()}
                                      for label, v in faults.items()},
            "values": values,
        }
        print(json.dumps({k: v for k, v in report[name].items() if k != "values"}, indent=1), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
