"""Does the speedup interval autotune prints hold? Per workload, one `autotune run`, then
re-checks spread over time: is each re-check's median ratio inside the printed interval
("where a re-measurement of as many pairs lands", 95%)?

Two kinds of re-check, alternating from round to round:
  independent  bench/independent_speedup.py OUT: the emitted launch.sh against a baseline
               script built from the same template, alternating, each run's own --report
               rate; as many pairs and seconds a run as the printed interval's pairs had
  wallclock    no measuring code of autotune's: the emitted launch.sh and the baseline's
               script run for N1 and N2 > N1 steps, each process timed with
               time.perf_counter() around it; rate = (N2 - N1) * batch / (t2 - t1), which
               removes start-up, setup and warm-up; a few pairs, the order alternating

The runs come first, then the re-checks in rounds, round-robin over the workloads (round 1:
w1 w2 w3 w4; round 2: ...), so a workload's re-checks are spread over the others' time
without idling; --min-gap-s is the least time between the starts of one workload's
re-checks (it waits only when a round is shorter than that). Everything goes as JSON lines
to OUT/calibration.jsonl (runs with the printed interval and the raw rates of autotune's
standalone pairs; re-checks with their raw rates and median ratio).

How to run it, on a quiet machine (nothing else measuring; it takes autotune's measurement
lock where it measures):

    .venv/bin/python bench/calibration.py                       # the four default workloads
    .venv/bin/python bench/calibration.py --workloads fashion_cnn tiny_lm tabular_mlp \\
        --rounds 6 --run-args='--trials 12' --run-args='tiny_lm=--trials 8'
    .venv/bin/python bench/calibration.py --resume              # go on after an interruption
    .venv/bin/python bench/calibration.py --table               # the Markdown table, from the records
    .venv/bin/python bench/calibration.py --rescore             # coverage of another interval formula

How long: a run with the README's arguments (--trials 12) takes 7-9 minutes on a quiet
2-core machine (BENCHMARKS.md: 400-550 s for fashion_cnn, most of it verification), an
independent re-check of 6 pairs of 8 s about 2.5 minutes, a wall-clock re-check (3 pairs of
4 processes) about 2 minutes; slow_setup pays its ~20 s setup in every process (+4 minutes
a re-check, +5 a run). The four default workloads with 4 rounds: about 30-35 minutes of
runs, then 4 rounds of about 9 minutes (--min-gap-s 400 never waits with four workloads),
70-80 minutes in all; with tabular_mlp and slow_setup too, about 2 hours.

--table and --rescore measure nothing. --rescore recomputes each run's interval from its
stored pair rates with autotune.verify.stats.speedup_interval (--session-sd X: with X as
its between-session drift; or --interval-function MODULE:NAME, a function of
(baseline_rates, candidate_rates, level)) and reports the coverage it would have had, and
how often a re-check stayed above its one-sided lower bound.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import importlib
import json
import os
import platform
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WORKLOADS = {
    "fashion_cnn": "examples/fashion_cnn.py",  # the README's example
    "small_batch_mlp": "bench/workloads/small_batch_mlp.py",
    "pipeline_bound": "bench/workloads/pipeline_bound.py",  # bound by its data pipeline
    "tiny_lm": "bench/workloads/tiny_lm.py",  # a transformer (examples/tiny_gpt.py needs transformers, and is slower)
    "small_batch_lm": "bench/workloads/small_batch_lm.py",  # a transformer at batch 4 (tune with --batch-range)
    "tabular_mlp": "bench/workloads/tabular_mlp.py",
    "slow_setup": "bench/workloads/slow_setup.py",  # ~20 s of setup per process
}
DEFAULT_WORKLOADS = ("fashion_cnn", "small_batch_mlp", "pipeline_bound", "tiny_lm")
README_RUN_ARGS = "--trials 12"  # the README's example command
RUN_ARGS: dict[str, str] = {}  # per-workload defaults; none differs from the README's yet
KINDS = ("independent", "wallclock")  # round 1, 2, 3, ...: alternating
RECORDS = "calibration.jsonl"
INDEPENDENT_SCRIPT = ROOT / "bench" / "independent_speedup.py"
# rank-group variables a launched script must not inherit (it starts its own ranks)
DIST_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR",
                  "MASTER_PORT", "TORCHELASTIC_RUN_ID")


# ---- pure parts (tests/test_calibration_bench.py) ----

def two_step_rate(n1: int, t1: float, n2: int, t2: float, batch_size: int) -> float:
    """Samples/s of the steps between N1 and N2: two runs of the same script, of N1 and N2
    steps, timed whole; what both pay (start-up, imports, setup, warm-up, the first N1
    steps' share of it) cancels."""
    if n2 <= n1:
        raise ValueError(f"N2 ({n2}) must exceed N1 ({n1})")
    if t2 <= t1:
        raise ValueError(f"the run of {n2} steps ({t2:.2f} s) was not slower than the run of {n1} ({t1:.2f} s)")
    return (n2 - n1) * batch_size / (t2 - t1)


def steps_for(seconds: float, samples_per_s: float, batch_size: int, *, least: int = 3) -> int:
    """Steps that take about ``seconds`` at ``samples_per_s``."""
    return max(least, round(seconds * samples_per_s / batch_size))


def paired_ratios(candidate: Sequence[float | None], baseline: Sequence[float | None]) -> list[float]:
    """Candidate over baseline, pair by pair; a pair with a side missing is left out."""
    return [c / b for c, b in zip(candidate, baseline) if c is not None and b is not None and b > 0]


def pair_order(index: int) -> list[tuple[str, int]]:
    """The four processes of wall-clock pair ``index`` (0-based), as (script, 0 for N1 or 1
    for N2): B1 B2 C1 C2, then C2 C1 B2 B1, and so on, so that neither script nor step
    count always goes first while the machine drifts."""
    order = [("baseline", 0), ("baseline", 1), ("candidate", 0), ("candidate", 1)]
    return order if index % 2 == 0 else order[::-1]


def kind_of_round(index: int) -> str:
    """The re-check kind of round ``index`` (0-based): independent, wallclock, independent, ..."""
    return KINDS[index % len(KINDS)]


def run_record(doc: Mapping[str, Any]) -> dict[str, Any]:
    """The figures of a run's best_config.json (as JSON) that calibration needs: the printed
    speedup (median, interval, level, pairs), the raw per-pair rates of its standalone pairs,
    the batch sizes and the launchers' rates. ``speedup`` is None where nothing was verified."""
    standalone = (doc.get("verification") or {}).get("standalone") or {}
    sp = doc.get("speedup")
    return {
        "speedup": None if sp is None else {"median": sp["median"], "low": sp["ci_low"], "high": sp["ci_high"],
                                            "level": sp["ci_level"], "pairs": sp["pairs"],
                                            "seconds_per_run": sp.get("seconds_per_run"),
                                            "unsteady": sp.get("unsteady")},
        "baseline_rates": list(standalone.get("baseline_samples_per_s") or []),
        "candidate_rates": list(standalone.get("samples_per_s") or []),
        "ratios": list(standalone.get("ratios") or []),
        "batch_size": doc["config"]["batch_size"],
        "baseline_batch_size": doc["baseline"]["config"]["batch_size"],
        "samples_per_s": (standalone.get("median_samples_per_s")
                          or (doc.get("best") or doc["baseline"])["samples_per_s"]),
        "baseline_samples_per_s": standalone.get("baseline_median_samples_per_s") or doc["baseline"]["samples_per_s"],
    }


def read_records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def inside(value: float, low: float, high: float) -> bool:
    return low <= value <= high


def relative_width(interval: Mapping[str, float]) -> float:
    return (interval["high"] - interval["low"]) / interval["median"]


Interval = dict[str, float]  # median, low, high, level; "lower": a one-sided lower bound, where known
IntervalFunction = Callable[[Sequence[float], Sequence[float], float], Interval]


def workload_rows(records: Iterable[Mapping[str, Any]],
                  rescore: IntervalFunction | None = None) -> list[dict[str, Any]]:
    """Per workload (in the order of its run): the interval (printed, or recomputed from the
    stored pair rates by ``rescore``), its re-checks (kind, median, inside or not, and
    above the one-sided lower bound where there is one) and the coverage. The latest run of
    a workload counts, with the re-checks recorded after it."""
    runs: dict[str, dict[str, Any]] = {}
    checks: dict[str, list[Mapping[str, Any]]] = {}
    for r in records:
        if r.get("kind") == "run":
            runs[r["workload"]] = dict(r)
            checks[r["workload"]] = []
        elif r.get("kind") == "recheck" and r["workload"] in runs:
            checks[r["workload"]].append(r)
    rows = []
    for name, run in runs.items():
        interval: Interval | None = None
        if run.get("speedup"):
            interval = {k: run["speedup"][k] for k in ("median", "low", "high", "level")}
            if rescore is not None:  # None where the run stored fewer than two pairs
                interval = (rescore(run["baseline_rates"], run["candidate_rates"], run["speedup"]["level"])
                            if len(paired_ratios(run["candidate_rates"], run["baseline_rates"])) >= 2 else None)
        done: list[dict[str, Any]] = []
        for c in checks[name]:
            if c.get("median") is None or interval is None:
                done.append({"kind": c.get("method"), "median": None, "inside": None, "above_lower": None,
                             "error": c.get("error"), "t": c.get("t")})
                continue
            lower = interval.get("lower")
            done.append({"kind": c["method"], "median": c["median"], "t": c.get("t"),
                         "inside": inside(c["median"], interval["low"], interval["high"]),
                         "above_lower": None if lower is None else c["median"] >= lower})
        judged = [d for d in done if d["inside"] is not None]
        times: list[float] = [d["t"] for d in judged if d.get("t") is not None]
        rows.append({"workload": name, "interval": interval, "run": run, "rechecks": done,
                     "inside": sum(d["inside"] for d in judged), "judged": len(judged),
                     "coverage": sum(d["inside"] for d in judged) / len(judged) if judged else None,
                     "span_min": (max(times) - min(times)) / 60 if len(times) > 1 else None})
    return rows


def overall(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Coverage over every judged re-check, by kind too; the intervals' median relative width;
    the share of re-checks above the one-sided lower bound where the intervals have one."""
    judged = [d for row in rows for d in row["rechecks"] if d["inside"] is not None]
    by_kind = {kind: [d["inside"] for d in judged if d["kind"] == kind] for kind in KINDS}
    widths = [relative_width(row["interval"]) for row in rows if row["interval"]]
    lower = [d["above_lower"] for d in judged if d["above_lower"] is not None]
    return {"inside": sum(d["inside"] for d in judged), "judged": len(judged),
            "coverage": sum(d["inside"] for d in judged) / len(judged) if judged else None,
            "by_kind": {k: (sum(v), len(v)) for k, v in by_kind.items()},
            "median_relative_width": statistics.median(widths) if widths else None,
            "above_lower": (sum(lower), len(lower)) if lower else None}


def _pct(part: int, whole: int) -> str:
    return f"{part} of {whole} ({part / whole:.0%})" if whole else "none"


def render_table(records: Sequence[Mapping[str, Any]], rows: Sequence[Mapping[str, Any]], *,
                 title: str = "printed interval") -> str:
    """Markdown, ready for BENCHMARKS.md: a header line (commit, date, CPU), per workload
    the interval, each re-check's median (I: independent_speedup.py, W: wall clock) in or
    out, its coverage; then overall coverage and the intervals' median relative width."""
    starts = [r for r in records if r.get("kind") == "start"]
    commits = sorted({f"{s['commit']}{' (modified)' if s.get('dirty') else ''}" for s in starts}) or ["unknown"]
    dates = sorted({s["date"][:10] for s in starts}) or ["unknown"]
    cpu = starts[0]["cpu"] if starts else "unknown CPU"
    cores = starts[0].get("cores") if starts else None
    column = "printed interval" if title == "printed interval" else "recomputed interval"
    lines = [f"Calibration of the {title}: commit {', '.join(commits)}, {', '.join(dates)}, "
             f"{cpu}{f' ({cores} cores)' if cores else ''}; `bench/calibration.py`.", "",
             f"| workload | {column} (level, pairs) | emitted | re-checks, in order (I: independent_speedup.py, "
             "W: wall clock) | spread | inside |",
             "| --- | --- | --- | --- | --- | --- |"]
    mark = {"independent": "I", "wallclock": "W"}
    for row in rows:
        run, iv = row["run"], row["interval"]
        if iv is None:
            shown = f"not verified (exit {run.get('exit_code')})"
        else:
            shown = (f"{iv['median']:.2f}x ({iv['low']:.2f}-{iv['high']:.2f}, {iv['level']:.0%}, "
                     f"{len(run['candidate_rates'])} pairs)")
            if iv.get("lower") is not None:
                shown += f", lower bound {iv['lower']:.2f}"
        checks = ", ".join(
            f"{mark.get(d['kind'], '?')} failed" if d["median"] is None
            else f"{mark.get(d['kind'], '?')} {d['median']:.2f} {'in' if d['inside'] else '**out**'}"
            for d in row["rechecks"]) or "none"
        span = f"{row['span_min']:.0f} min" if row["span_min"] is not None else "-"
        lines.append(f"| {row['workload']} | {shown} | {run.get('config', '')} | {checks} | {span} | "
                     f"{_pct(row['inside'], row['judged'])} |")
    total = overall(rows)
    kinds = "; ".join(f"{k} {_pct(*total['by_kind'][k])}" for k in KINDS)
    width = total["median_relative_width"]
    lines += ["", f"Overall: {_pct(total['inside'], total['judged'])} of the re-checks' medians inside "
              f"({kinds}); the intervals' median relative width (high - low) / median: "
              f"{'-' if width is None else f'{width:.2f}'}."]
    if total["above_lower"]:
        lines[-1] += f" Above the one-sided lower bound: {_pct(*total['above_lower'])}."
    return "\n".join(lines) + "\n"


# ---- the interval formula to rescore with ----

def _as_interval(result: Any, level: float) -> Interval:
    """A speedup_interval result, whatever its shape: a mapping (median, low/ci_low,
    high/ci_high, lower/lower_bound/one_sided_low), an object with those attributes (or with
    its interval's as ``interval``: ratio, low, high), or a tuple (median, low, high[, lower])."""
    names = {"median": ("median", "ratio"), "low": ("low", "ci_low"), "high": ("high", "ci_high"),
             "lower": ("lower", "lower_bound", "one_sided_low", "one_sided_lower", "ci_lower")}
    if isinstance(result, (tuple, list)):
        out = dict(zip(("median", "low", "high", "lower"), (float(v) for v in result)))
    else:
        inner = getattr(result, "interval", None)
        get = result.get if isinstance(result, Mapping) else (
            lambda key: getattr(result, key, None) if hasattr(result, key) else getattr(inner, key, None))
        out = {}
        for key, options in names.items():
            value = next((v for v in map(get, options) if v is not None), None)
            if value is not None:
                out[key] = float(value)
    missing = {"median", "low", "high"} - out.keys()
    if missing:
        raise ValueError(f"the interval function's result lacks {sorted(missing)}: {result!r}")
    return {**out, "level": level}


def interval_function(spec: str | None = None, *, session_sd: float | None = None
                      ) -> tuple[str, IntervalFunction]:
    """The function --rescore uses, and its name: ``spec`` (MODULE:NAME), else
    autotune.verify.stats.speedup_interval, with ``session_sd`` in place of its
    between-session drift where given. The function takes (baseline_rates,
    candidate_rates, level)."""
    spec = spec or "autotune.verify.stats:speedup_interval"
    module, _, name = spec.partition(":")
    fn = getattr(importlib.import_module(module), name)
    if session_sd is not None:
        fn = functools.partial(fn, session_sd=session_sd)
        spec = f"{spec} (session_sd={session_sd})"

    def adapted(baseline: Sequence[float], candidate: Sequence[float], level: float) -> Interval:
        try:
            result = fn(list(baseline), list(candidate), level=level)
        except TypeError:
            result = fn(list(baseline), list(candidate), level)
        return _as_interval(result, level)

    return spec, adapted


# ---- measuring ----

def _now() -> tuple[float, str]:
    t = time.time()
    return t, datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")


def _append(path: Path, record: Mapping[str, Any]) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def _run_args(overrides: Sequence[str]) -> dict[str, list[str]]:
    """--run-args 'ARGS' (every workload) and --run-args 'NAME=ARGS' (one), later ones winning."""
    every: str | None = None
    one: dict[str, str] = {}
    for o in overrides:
        name, sep, rest = o.partition("=")
        if sep and name in WORKLOADS:
            one[name] = rest
        else:
            every = o
    return {name: shlex.split(one.get(name, every if every is not None else RUN_ARGS.get(name, README_RUN_ARGS)))
            for name in WORKLOADS}


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _run_logged(argv: list[str], log: Path, *, timeout_s: float, env: Mapping[str, str] | None = None) -> int:
    """Run ``argv`` from the repository root (where the model files' relative paths are
    meant), its output appended to ``log``; its process group is ended at ``timeout_s``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        out.write(f"\n$ {shlex.join(argv)}\n".encode())
        out.flush()
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=None if env is None else dict(env))
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise
        except BaseException:
            _kill_group(proc)
            raise


def tune(name: str, args: list[str], folder: Path, *, timeout_s: float) -> dict[str, Any]:
    """One `autotune run` of workload ``name``; its record."""
    out = folder / "runs" / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    argv = [sys.executable, "-m", "autotune", "run", WORKLOADS[name], "--out", str(out), *args]
    t, when = _now()
    print(f"[{when}] autotune run {name}: {shlex.join(argv[2:])}", flush=True)
    start = time.perf_counter()
    try:
        code: int | None = _run_logged(argv, folder / "logs" / f"{name}-run.log", timeout_s=timeout_s)
    except subprocess.TimeoutExpired:
        code = None  # ended at --run-timeout-s; a document it wrote is still read
    record: dict[str, Any] = {"kind": "run", "workload": name, "model_file": WORKLOADS[name], "run_args": args,
                              "out": str(out), "exit_code": code, "wall_s": round(time.perf_counter() - start, 1),
                              "t": t, "time": when}
    doc_path = out / "best_config.json"
    if doc_path.exists():
        doc = json.loads(doc_path.read_text())
        from autotune.config import TrialConfig

        record.update(run_record(doc), config=TrialConfig.from_dict(doc["config"]).short())
    else:
        record["speedup"] = None
    sp = record["speedup"]
    print(f"  exit {code} in {record['wall_s']:.0f} s: " + (
        "nothing verified" if sp is None else
        f"{sp['median']:.2f}x ({sp['low']:.2f}-{sp['high']:.2f}, {sp['level']:.0%}, {sp['pairs']} pairs)"), flush=True)
    return record


def independent_check(run: Mapping[str, Any], folder: Path, *, pairs: int | None, seconds: float | None,
                      timeout_s: float) -> dict[str, Any]:
    """bench/independent_speedup.py on the run's output folder, as many pairs and seconds a
    run as the printed interval's pairs (unless given)."""
    sp = run["speedup"]
    pairs = pairs or sp["pairs"]
    seconds = seconds or sp.get("seconds_per_run") or 8.0
    argv = [sys.executable, str(INDEPENDENT_SCRIPT), run["out"], "--pairs", str(pairs),
            "--seconds", str(seconds)]
    result = Path(run["out"]) / "independent" / "result.json"
    result.unlink(missing_ok=True)
    code = _run_logged(argv, folder / "logs" / f"{run['workload']}-independent.log", timeout_s=timeout_s)
    if code != 0 or not result.exists():
        raise RuntimeError(f"independent_speedup.py exited {code}; see its log")
    data = json.loads(result.read_text())
    return {"pairs": pairs, "seconds": seconds, "baseline_rates": data["baseline_samples_per_s"],
            "candidate_rates": data["samples_per_s"], "ratios": data["ratios"], "median": data["median"]}


def baseline_launcher(run: Mapping[str, Any]) -> Path:
    """The user's baseline as a script: the template with the baseline configuration,
    written once beside the run's output (as independent_speedup.py writes its own)."""
    from autotune.document import paths
    from autotune.document.run import RunDocument
    from autotune.emit import outputs as emit

    out = Path(run["out"])
    folder = out / "calibration-baseline"
    doc = RunDocument.from_json(json.loads((out / "best_config.json").read_text()))
    if not (folder / "best_config.json").exists():
        emit.write_candidate(folder, cfg=doc.baseline.config, model_file=paths.model_file(doc, out), env={},
                             description="baseline")
    return folder / json.loads((folder / "best_config.json").read_text())["outputs"]["launcher"]


def tuned_launcher(run: Mapping[str, Any]) -> Path:
    out = Path(run["out"])
    return out / json.loads((out / "best_config.json").read_text())["outputs"]["launcher"]


def time_script(launcher: Path, steps: int, log: Path, *, timeout_s: float) -> float:
    """Seconds the launcher takes, start to exit, for ``steps`` steps (no checkpoint, no
    evaluate(), as good as no logging), timed here with perf_counter."""
    from autotune.trials import measure_lock  # only keeps another tuner from measuring meanwhile

    env = {k: v for k, v in os.environ.items() if k not in DIST_VARIABLES}
    argv = ["bash", str(launcher), "--max-steps", str(steps), "--no-checkpoint", "--no-evaluate",
            "--log-every", str(steps)]
    with measure_lock.held():
        start = time.perf_counter()
        code = _run_logged(argv, log, timeout_s=timeout_s, env=env)
        elapsed = time.perf_counter() - start
    if code != 0:
        raise RuntimeError(f"{launcher} --max-steps {steps} exited {code}; see {log}")
    return elapsed


def wallclock_check(run: Mapping[str, Any], folder: Path, *, pairs: int, short_s: float, long_s: float,
                    timeout_s: float) -> dict[str, Any]:
    """The emitted launch.sh and the baseline's script, each for N1 and N2 steps, timed
    whole, in the order of ``pair_order``."""
    scripts = {"baseline": (baseline_launcher(run), run["baseline_batch_size"], run["baseline_samples_per_s"]),
               "candidate": (tuned_launcher(run), run["batch_size"], run["samples_per_s"])}
    steps = {name: (steps_for(short_s, rate, batch), steps_for(long_s, rate, batch)) for name, (_, batch, rate)
             in scripts.items()}
    steps = {name: (n1, max(n2, n1 + 1)) for name, (n1, n2) in steps.items()}
    log = folder / "logs" / f"{run['workload']}-wallclock.log"
    rates: dict[str, list[float | None]] = {"baseline": [], "candidate": []}
    runs = []
    for i in range(pairs):
        times: dict[tuple[str, int], float] = {}
        for name, which in pair_order(i):
            times[name, which] = time_script(scripts[name][0], steps[name][which], log, timeout_s=timeout_s)
        for name in ("baseline", "candidate"):
            (n1, n2), (t1, t2) = steps[name], (times[name, 0], times[name, 1])
            try:
                rate: float | None = two_step_rate(n1, t1, n2, t2, scripts[name][1])
            except ValueError as exc:
                print(f"  pair {i + 1} {name}: {exc}", flush=True)
                rate = None
            rates[name].append(rate)
            runs.append({"pair": i, "script": name, "n1": n1, "t1": t1, "n2": n2, "t2": t2, "rate": rate})
            print(f"  pair {i + 1} {name}: {n1} steps {t1:.2f} s, {n2} steps {t2:.2f} s: "
                  f"{'-' if rate is None else f'{rate:.1f}'} samples/s", flush=True)
    ratios = paired_ratios(rates["candidate"], rates["baseline"])
    return {"pairs": pairs, "steps": steps, "timings": runs, "baseline_rates": rates["baseline"],
            "candidate_rates": rates["candidate"], "ratios": ratios,
            "median": statistics.median(ratios) if ratios else None}


def measure(args: argparse.Namespace) -> int:
    folder: Path = args.out.absolute()  # the runs' folders are recorded absolute: the checks run from ROOT
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / RECORDS
    records = read_records(path)
    if records and not args.resume:
        print(f"{path} holds records already: --resume to go on with them, or another --out", file=sys.stderr)
        return 2
    t, when = _now()
    _append(path, {"kind": "start", "t": t, "date": when, "commit": _git("rev-parse", "--short", "HEAD"),
                   "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
                   "cpu": cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                   "argv": sys.argv[1:]})
    run_args = _run_args(args.run_args)
    runs = {r["workload"]: r for r in records if r.get("kind") == "run"}
    for name in args.workloads:
        if name not in runs:
            record = tune(name, run_args[name], folder, timeout_s=args.run_timeout_s)
            _append(path, record)
            runs[name] = record
    verified = [n for n in args.workloads if runs[n].get("speedup")]
    for n in set(args.workloads) - set(verified):
        print(f"{n}: nothing verified (exit {runs[n].get('exit_code')}): no re-checks", flush=True)
    done: dict[str, list[float]] = {n: [] for n in verified}
    for r in read_records(path):
        if r.get("kind") == "recheck" and r["workload"] in done and r.get("out") == runs[r["workload"]]["out"]:
            done[r["workload"]].append(r["t"])
    for round_index in range(args.rounds):
        for name in verified:
            if len(done[name]) > round_index:
                continue  # done before an interruption
            kind = kind_of_round(round_index)
            if done[name]:
                wait = done[name][-1] + args.min_gap_s - time.time()
                if wait > 0:
                    print(f"waiting {wait:.0f} s (--min-gap-s) before {name}'s next re-check", flush=True)
                    time.sleep(wait)
            t, when = _now()
            print(f"[{when}] round {round_index + 1} {name}: {kind} re-check", flush=True)
            start = time.perf_counter()
            check: dict[str, Any] = {"kind": "recheck", "method": kind, "workload": name, "round": round_index + 1,
                                     "out": runs[name]["out"], "t": t, "time": when}
            try:
                if kind == "independent":
                    check.update(independent_check(runs[name], folder, pairs=args.pairs, seconds=args.seconds,
                                                   timeout_s=args.check_timeout_s))
                else:
                    check.update(wallclock_check(runs[name], folder, pairs=args.wall_pairs,
                                                 short_s=args.wall_seconds[0], long_s=args.wall_seconds[1],
                                                 timeout_s=args.script_timeout_s))
            except (RuntimeError, OSError, subprocess.TimeoutExpired, KeyError, ValueError) as exc:
                check.update(error=str(exc), median=None)
            check["wall_s"] = round(time.perf_counter() - start, 1)
            _append(path, check)
            done[name].append(t)
            sp = runs[name]["speedup"]
            m = check.get("median")
            print(f"  {name} {kind}: " + (f"failed: {check.get('error') or 'no pair gave a rate'}" if m is None else
                  f"{m:.2f}x, {'inside' if inside(m, sp['low'], sp['high']) else 'OUTSIDE'} "
                  f"{sp['low']:.2f}-{sp['high']:.2f}") + f" ({check['wall_s']:.0f} s)", flush=True)
    print(render_table(read_records(path), workload_rows(read_records(path))), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "bench-out" / "calibration",
                   help=f"folder of the records ({RECORDS}), the runs' output folders and logs")
    p.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS), default=list(DEFAULT_WORKLOADS))
    p.add_argument("--run-args", action="append", default=[], metavar="[WORKLOAD=]ARGS",
                   help=f"arguments of `autotune run` for every workload, or for one, as "
                        f"--run-args='--trials 8' (repeatable; default {README_RUN_ARGS!r}, the README's)")
    p.add_argument("--rounds", type=int, default=4, help="re-check rounds, the kinds alternating (default 4)")
    p.add_argument("--min-gap-s", type=float, default=400.0,
                   help="least seconds between the starts of a workload's re-checks (default 400: "
                        "4 re-checks span at least 20 minutes)")
    p.add_argument("--pairs", type=int, default=None,
                   help="independent re-check: pairs (default: as many as the printed interval's)")
    p.add_argument("--seconds", type=float, default=None,
                   help="independent re-check: seconds a run (default: the run's standalone seconds)")
    p.add_argument("--wall-pairs", type=int, default=3, help="wall-clock re-check: pairs (default 3)")
    p.add_argument("--wall-seconds", type=float, nargs=2, default=[3.0, 12.0], metavar=("S1", "S2"),
                   help="wall-clock re-check: N1 and N2 are the steps that take about S1 and S2 "
                        "seconds at the run's measured rate (default 3 12)")
    p.add_argument("--run-timeout-s", type=float, default=3600.0)
    p.add_argument("--check-timeout-s", type=float, default=1800.0, help="one independent re-check, whole")
    p.add_argument("--script-timeout-s", type=float, default=600.0, help="one process of a wall-clock re-check")
    p.add_argument("--resume", action="store_true",
                   help="go on with the records in --out: runs done are kept, rounds done skipped")
    p.add_argument("--table", action="store_true", help="print the Markdown table from the records; measure nothing")
    p.add_argument("--rescore", action="store_true",
                   help="recompute each run's interval from its stored pair rates and print the table "
                        "under it; measure nothing")
    p.add_argument("--interval-function", default=None, metavar="MODULE:NAME",
                   help="--rescore with this function of (baseline_rates, candidate_rates, level) "
                        "(default autotune.verify.stats:speedup_interval)")
    p.add_argument("--session-sd", type=float, default=None,
                   help="--rescore with this between-session drift (log-ratio SD) in speedup_interval")
    args = p.parse_args(argv)
    if args.table or args.rescore:
        records = read_records(args.out / RECORDS)
        if not records:
            print(f"no records in {args.out / RECORDS}", file=sys.stderr)
            return 2
        if args.table:
            print(render_table(records, workload_rows(records)))
        if args.rescore:
            name, fn = interval_function(args.interval_function, session_sd=args.session_sd)
            print(render_table(records, workload_rows(records, rescore=fn),
                               title=f"interval recomputed by {name}"))
        return 0
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())
