"""Benchmark the tuner itself (issue 7): speedup found, share of the optimum, cost.

Per workload, on this machine:
  (a) autotune     `autotune run` with its default budget, as a user runs it
  (b) sample       a random sample of autotune's space (the full grid is ~15k
                   configurations here: too big to measure), best measured config
  (c) random       random search with autotune's trial budget, best measured config
  (d) heuristic    PyTorch's CPU launcher defaults (all cores, tcmalloc/jemalloc, pinning)
Then the four picks, the `--top` best-scoring configurations of all searches together,
and the baseline are measured side by side in ONE alternating session (autotune's own
verification method: warmed-up processes, one window each in turn, 20 rounds), so every
speedup is a ratio from the same run. The optimum is estimated as the best of those, two
ways: the best median (biased up: the largest of several noisy medians), and held out
(the best of the odd rounds scored on the even rounds and the other way round, each
pick's share taken window against window within a round).
Per-trial overhead (launch + imports, the model file's setup, warm-up) comes from the
phases autotune records on each of its trials; the grid's time is its size times the
median trial.

    python bench/run_bench.py --workloads fashion_cnn cifar_cnn --sample 40
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import optuna
from optuna.trial import TrialState

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.config import TrialConfig
from autotune.options import RunOptions
from autotune.probes import probe_machine
from autotune.search.budget import SearchBudget
from autotune.search.course import Course
from autotune.search.starts import heuristics
from autotune.search.task_space import build_task_space
from autotune.search.tuner import Tuner, open_study
from autotune.sections import SearchOptions
from autotune.task import load_task
from autotune.trials.runner import Measurement, TrialRunner
from autotune.verify import side_by_side, stats

WORKLOADS = {
    "fashion_cnn": ROOT / "examples" / "fashion_cnn.py",
    "cifar_cnn": ROOT / "bench" / "workloads" / "cifar_cnn.py",
    "pipeline_bound": ROOT / "bench" / "workloads" / "pipeline_bound.py",
    "wide_mlp": ROOT / "bench" / "workloads" / "wide_mlp.py",
    "tiny_lm": ROOT / "bench" / "workloads" / "tiny_lm.py",
}


def search(name: str, task, machine, out: Path, *, trials: int, sampler) -> tuple[TrialConfig, dict]:
    space = build_task_space(task, machine, SearchOptions.of(RunOptions(), task=task))
    runner = TrialRunner(model_file=task.path, machine=machine, workdir=out / name,
                         measurement=Measurement())
    study = open_study(storage_path=out / f"{name}.journal", study_name=name, sampler=sampler)
    started = time.monotonic()
    outcome = Tuner(study=study, space=space, runner=runner, course=Course(budget=SearchBudget(trials=trials))).run()
    wall = time.monotonic() - started
    best = outcome.ranked[0]
    return best.config, {"wall_s": wall, "trials": trials, "best_search_value": best.value}


def measured_trials(journal: Path) -> list[dict]:
    """Every measured trial of a study file: its config, search value and phases."""
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(str(journal)))
    rows = []
    for summary in optuna.get_all_study_summaries(storage):
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        for t in study.get_trials(deepcopy=False):
            result = t.user_attrs.get("result")
            if t.user_attrs.get("duplicate_of") is not None or not result:
                continue
            rows.append({"config": TrialConfig.from_dict(t.user_attrs["config"]),
                         "value": t.value if t.state == TrialState.COMPLETE else None,
                         "state": t.state.name, "wall_s": result.get("wall_s"),
                         "phases": result.get("phases") or {}})
    return rows


def overhead(rows: list[dict]) -> dict:
    """Median per-trial split of wall time, over the trials that ran to the end."""
    full = [r for r in rows if r["state"] == "COMPLETE" and r["phases"].get("measure_s")]
    out = {"trials": len(full),
           "wall_s": round(statistics.median(r["wall_s"] for r in full), 2) if full else None}
    for key in ("start_import_s", "setup_s", "warmup_s", "measure_s", "overhead_s"):
        vals = [r["phases"][key] for r in full if key in r["phases"]]
        out[key] = round(statistics.median(vals), 2) if vals else None
    multi = [r["phases"]["start_import_s"] for r in full
             if r["config"].nprocs > 1 and "start_import_s" in r["phases"]]
    single = [r["phases"]["start_import_s"] for r in full
              if r["config"].nprocs == 1 and "start_import_s" in r["phases"]]
    out["start_import_s_1proc"] = round(statistics.median(single), 2) if single else None
    out["start_import_s_torchrun"] = round(statistics.median(multi), 2) if multi else None
    return out


def held_out_share(rates: dict[str, list[float]], key: str) -> dict:
    """``key``'s rate over the optimum's, round by round, where the optimum scored on the
    even rounds is the configuration with the best median on the odd rounds, and the other
    way round. Choosing and scoring on the same rounds would favour whichever configuration
    had lucky windows (the maximum of several noisy medians is biased up)."""
    n = min(len(v) for v in rates.values())
    halves = (list(range(0, n, 2)), list(range(1, n, 2)))
    ratios, chosen = [], []
    for scored, chooser in (halves, halves[::-1]):
        best = max(rates, key=lambda k: statistics.median(rates[k][t] for t in chooser))
        chosen.append(best)
        ratios += [rates[key][t] / rates[best][t] for t in scored]
    return {**stats.ratio_interval(ratios).to_json(), "optimum_chosen_on_other_half": chosen}


def bench_workload(name: str, path: Path, out: Path, *, sample: int, rounds: int, top: int) -> dict:
    machine = probe_machine()
    task = load_task(path)
    out.mkdir(parents=True, exist_ok=True)
    # the space `autotune run` searches
    space = build_task_space(task, machine, SearchOptions.of(RunOptions(), task=task))
    grid = space.grid_size
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
    autotune_rows = measured_trials(out / "autotune" / "study.journal")

    cfg, info = search("random", task, machine, out, trials=budget,
                       sampler=optuna.samplers.RandomSampler(seed=2))
    results["random"] = {"config": cfg, **info}
    cfg, info = search("sample", task, machine, out, trials=sample,
                       sampler=optuna.samplers.RandomSampler(seed=1))
    results["sample"] = {"config": cfg, **info}
    results["heuristic"] = {"config": heuristics(space, machine)[0], "wall_s": 0.0, "trials": 0}

    # The optimum is estimated as the best, re-measured side by side, of: every method's
    # pick, and the `top` best-scoring distinct configurations of all searches together.
    everything = (autotune_rows + measured_trials(out / "random.journal")
                  + measured_trials(out / "sample.journal"))
    scored = sorted((r for r in everything if r["value"] is not None),
                    key=lambda r: r["value"], reverse=True)
    unique: list[TrialConfig] = []
    for m in results:
        if results[m]["config"] not in unique:
            unique.append(results[m]["config"])
    extra = 0
    for r in scored:
        if extra >= top:
            break
        if r["config"] not in unique and r["config"] != space.baseline:
            unique.append(r["config"])
            extra += 1
    runner = TrialRunner(model_file=task.path, machine=machine, workdir=out / "final",
                         measurement=Measurement())
    base, checks = side_by_side.speed_check(runner, space.baseline, unique, rounds=rounds)
    by_config = {str(c): ch.detail for c, ch in zip(unique, checks)}
    best_key = max(by_config, key=lambda k: by_config[k].get("median") or 0.0)
    optimum = by_config[best_key]
    rates = {c.short(): by_config[str(c)]["samples_per_s"] for c in unique
             if by_config[str(c)].get("samples_per_s")}
    table: dict = {}
    for m in results:
        d = by_config[str(results[m]["config"])]
        short = results[m]["config"].short()
        table[m] = {
            "config": short,
            "speedup": d.get("median"), "ci_low": d.get("ci_low"), "ci_high": d.get("ci_high"),
            "ci_level": d.get("ci_level"),
            "share_of_optimum": (d.get("median") or 0.0) / optimum["median"],
            "share_held_out": held_out_share(rates, short) if short in rates else None,
            "tuning_wall_s": round(results[m]["wall_s"], 1), "trials": results[m]["trials"],
        }
    pick = table["autotune"]["config"]
    for m in ("random", "heuristic"):
        other = table[m]["config"]
        table["autotune"][f"vs_{m}"] = (stats.paired_ratio(rates[pick], rates[other]).to_json()
                                        if pick in rates and other in rates else None)
    table["_rates"] = {"baseline": list(base.samples_per_s), **rates}
    table["_remeasured"] = [{"config": c.short(), "median": by_config[str(c)].get("median"),
                             "ci_low": by_config[str(c)].get("ci_low"),
                             "ci_high": by_config[str(c)].get("ci_high")} for c in unique]
    table["_optimum"] = {"config": next(c.short() for c in unique if str(c) == best_key),
                         "speedup": optimum.get("median"), "ci_low": optimum.get("ci_low"),
                         "ci_high": optimum.get("ci_high"),
                         "distinct_configs_measured": len({str(r["config"]) for r in everything})}
    table["_baseline_samples_per_s"] = base.median_samples_per_s
    table["_autotune_reported"] = results["autotune"]["reported_speedup"]
    table["_overhead"] = overhead(autotune_rows)
    median_trial = table["_overhead"]["wall_s"] or 0.0
    table["_grid"] = {"configs": grid, "estimated_wall_s": round(grid * median_trial),
                      "autotune_share": round(results["autotune"]["wall_s"] / (grid * median_trial), 5)
                      if median_trial else None}
    return table


def _share(s: dict | None) -> str:
    return f"{s['median']:.0%} ({s['ci_low']:.0%}-{s['ci_high']:.0%})" if s else "-"


def _ratio(s: dict | None) -> str:
    return f"{s['median']:.2f}x ({s['ci_low']:.2f}-{s['ci_high']:.2f})" if s else "-"


def summary(report: dict) -> str:
    """The summary table of BENCHMARKS.md: one row a workload."""
    lines = ["| workload | autotune | share of held-out optimum | share of best median | "
             "autotune / random search | autotune / heuristic | tuning time | grid (estimated) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, t in report.items():
        a, grid = t["autotune"], t["_grid"]
        lines.append(
            f"| {name} | **{a['speedup']:.2f}x** ({a['ci_low']:.2f}-{a['ci_high']:.2f}) | "
            f"{_share(a.get('share_held_out'))} | {a['share_of_optimum']:.0%} of "
            f"{t['_optimum']['speedup']:.2f}x | {_ratio(a.get('vs_random'))} | "
            f"{_ratio(a.get('vs_heuristic'))} | {a['tuning_wall_s']:.0f} s | "
            f"{grid['estimated_wall_s'] / 3600:.1f} h ({grid['autotune_share']:.1%}) |")
    return "\n".join(lines) + "\n"


LABELS = {"autotune": "autotune", "random": "random search", "sample": "sample",
          "heuristic": "launcher heuristic"}


def markdown(name: str, table: dict) -> str:
    """One workload's section of BENCHMARKS.md."""
    base = table["_baseline_samples_per_s"]
    opt = table["_optimum"]
    level = table["autotune"].get("ci_level") or 0.978
    lines = [f"### {name} (baseline {base:,.0f} samples/s)", "",
             f"| method | chosen configuration | speedup ({level:.0%} interval) | share of best median | "
             f"share of held-out optimum ({level:.0%} interval) | tuning time | trials |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for m, label in LABELS.items():
        row = table[m]
        label = f"sample of {row['trials']}" if m == "sample" else label
        speed = f"{row['speedup']:.2f}x ({row['ci_low']:.2f}-{row['ci_high']:.2f})"
        if m == "autotune":
            speed = f"**{speed.split(' ')[0]}** {speed.split(' ', 1)[1]}"
        lines.append(f"| {label} | {row['config'].replace('layout=', '')} | {speed} | "
                     f"{row['share_of_optimum']:.0%} | {_share(row.get('share_held_out'))} | "
                     f"{row['tuning_wall_s']:.0f} s | {row['trials']} |")
    rep = table["_autotune_reported"]
    ov, grid = table["_overhead"], table["_grid"]
    lines += [
        "",
        f"- Optimum estimate: {opt['config'].replace('layout=', '')}, {opt['speedup']:.2f}x "
        f"({opt['ci_low']:.2f}-{opt['ci_high']:.2f}); best of {len(table['_remeasured'])} "
        f"configurations re-measured side by side, chosen from {opt['distinct_configs_measured']} "
        "distinct configurations measured by the searches.",
        f"- autotune's own report in that run: {rep['median']:.2f}x ({rep['ci_low']:.2f}-{rep['ci_high']:.2f}).",
        f"- Grid: {grid['configs']:,} configurations x {ov['wall_s']:.1f} s (median trial) = "
        f"~{grid['estimated_wall_s'] / 3600:.1f} h; autotune's tuning time is "
        f"{grid['autotune_share']:.1%} of it.",
        f"- Per-trial overhead (median over {ov['trials']} full trials of autotune's search): "
        f"{ov['overhead_s']:.1f} s of {ov['wall_s']:.1f} s; launch + imports "
        f"{ov['start_import_s_1proc']} s (one process)"
        + (f" / {ov['start_import_s_torchrun']} s (torchrun)" if ov["start_import_s_torchrun"] else "")
        + ", "
        f"the model file's setup {ov['setup_s']:.1f} s, warm-up {ov['warmup_s']:.1f} s; measuring "
        f"{ov['measure_s']:.1f} s.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    p.add_argument("--sample", type=int, default=40, help="configurations sampled for the optimum")
    p.add_argument("--rounds", type=int, default=20,
                   help="alternating rounds of the side-by-side session (default 20)")
    p.add_argument("--top", type=int, default=3,
                   help="best-scoring configurations of all searches added to the re-measurement")
    p.add_argument("--out", type=Path, default=ROOT / "bench-out")
    p.add_argument("--render", type=Path, metavar="BENCH_JSON",
                   help="only print the markdown tables of an earlier run's bench.json")
    args = p.parse_args()
    if args.render:
        report = json.loads(args.render.read_text())
        print(summary(report))
        for name, table in report.items():
            print(markdown(name, table))
        return 0
    report = {}
    for name in args.workloads:
        print(f"== {name}", flush=True)
        report[name] = bench_workload(name, WORKLOADS[name], args.out / name, sample=args.sample,
                                      rounds=args.rounds, top=args.top)
        print(json.dumps(report[name], indent=1), flush=True)
        (args.out / "bench.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
