"""Benchmark the tuner itself (issue 7): speedup found, share of the optimum, cost.

Per workload, on this machine:
  (a) autotune     `autotune run` with its default budget, as a user runs it
  (b) optimum      a large random sample of autotune's space (the full grid is ~15k
                   configurations here: too big to measure), best measured config
  (c) random       random search with autotune's trial budget, best measured config
  (d) heuristic    PyTorch's CPU launcher defaults (all cores, tcmalloc/jemalloc, pinning)
Then the four winners and the baseline are measured side by side in ONE alternating
session (autotune's own verification method: warmed-up processes, one window each in
turn, 10 rounds), so every speedup is a ratio from the same run.

    python bench/run_bench.py --workloads fashion_cnn cifar_cnn --sample 40
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import optuna

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune import verify  # noqa: E402
from autotune.commands.run import heuristics  # noqa: E402
from autotune.config import TrialConfig  # noqa: E402
from autotune.search import Tuner, open_study  # noqa: E402
from autotune.space import build_space  # noqa: E402
from autotune.task import load_task  # noqa: E402
from autotune.trial import Measurement, TrialRunner  # noqa: E402
from probes import probe_machine  # noqa: E402

WORKLOADS = {
    "fashion_cnn": ROOT / "examples" / "fashion_cnn.py",
    "cifar_cnn": ROOT / "bench" / "workloads" / "cifar_cnn.py",
    "pipeline_bound": ROOT / "bench" / "workloads" / "pipeline_bound.py",
    "wide_mlp": ROOT / "bench" / "workloads" / "wide_mlp.py",
    "tiny_lm": ROOT / "bench" / "workloads" / "tiny_lm.py",
}


def search(name: str, task, machine, out: Path, *, trials: int, sampler) -> tuple[TrialConfig, dict]:
    space = build_space(machine, baseline_batch=task.batch_size, dataset_len=task.dataset_len,
                        image_inputs=task.image_inputs)
    runner = TrialRunner(model_file=task.path, machine=machine, workdir=out / name,
                         measurement=Measurement())
    study = open_study(storage_path=out / f"{name}.journal", study_name=name, sampler=sampler)
    started = time.monotonic()
    outcome = Tuner(study=study, space=space, runner=runner, trials=trials, timeout_s=None).run()
    wall = time.monotonic() - started
    best = outcome.ranked[0]
    return best.config, {"wall_s": wall, "trials": trials, "best_search_value": best.value}


def bench_workload(name: str, path: Path, out: Path, *, sample: int, rounds: int) -> dict:
    machine = probe_machine().to_dict()
    task = load_task(path)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict] = {}

    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "autotune", "run", str(path), "--out",
                           str(out / "autotune"), "--json"], capture_output=True, text=True)
    doc = json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}
    if not doc:
        raise RuntimeError(f"autotune run failed on {name}:\n{proc.stderr[-3000:]}")
    results["autotune"] = {"config": TrialConfig.from_dict(doc["config"]),
                           "wall_s": time.monotonic() - started,
                           "trials": doc["search"]["measured"], "verified": doc["verified"],
                           "reported_speedup": doc["speedup"]}
    budget = doc["search"]["measured"]

    cfg, info = search("optimum", task, machine, out, trials=sample,
                       sampler=optuna.samplers.RandomSampler(seed=1))
    results["optimum"] = {"config": cfg, **info}
    cfg, info = search("random", task, machine, out, trials=budget,
                       sampler=optuna.samplers.RandomSampler(seed=2))
    results["random"] = {"config": cfg, **info}
    space = build_space(machine, baseline_batch=task.batch_size, dataset_len=task.dataset_len,
                        image_inputs=task.image_inputs)
    results["heuristic"] = {"config": heuristics(space, machine)[0], "wall_s": 0.0, "trials": 0}

    # The optimum is the best of everything measured, including the other methods' picks.
    runner = TrialRunner(model_file=task.path, machine=machine, workdir=out / "final",
                         measurement=Measurement())
    methods = list(results)
    unique: list[TrialConfig] = []
    for m in methods:
        if results[m]["config"] not in unique:
            unique.append(results[m]["config"])
    base, checks = verify.speed_check(runner, space.baseline, unique, rounds=rounds)
    by_config = {str(c): ch.detail for c, ch in zip(unique, checks)}
    optimum_speedup = max(d.get("median", 0.0) for d in by_config.values())
    table = {}
    for m in methods:
        d = by_config[str(results[m]["config"])]
        table[m] = {
            "config": results[m]["config"].short(),
            "speedup": d.get("median"), "ci_low": d.get("ci_low"), "ci_high": d.get("ci_high"),
            "share_of_optimum": (d.get("median") or 0.0) / optimum_speedup if optimum_speedup else None,
            "tuning_wall_s": round(results[m]["wall_s"], 1), "trials": results[m]["trials"],
        }
    table["_baseline_samples_per_s"] = base["median_samples_per_s"]
    table["_autotune_reported"] = results["autotune"]["reported_speedup"]
    table["_sample_wall_s"] = round(results["optimum"]["wall_s"], 1)
    return table


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--sample", type=int, default=40, help="configurations sampled for the optimum")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--out", type=Path, default=ROOT / "bench-out")
    args = p.parse_args()
    report = {}
    for name in args.workloads:
        print(f"== {name}", flush=True)
        report[name] = bench_workload(name, WORKLOADS[name], args.out / name, sample=args.sample,
                                      rounds=args.rounds)
        print(json.dumps(report[name], indent=1), flush=True)
        (args.out / "bench.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
