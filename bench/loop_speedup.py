"""Check the speedup autotune prints for a plain training-loop script, without any of
autotune's code: run the user's script as written and the tuned version of it, alternately
and each alone, and compare the throughputs the script prints itself.

    python bench/loop_speedup.py --script examples/loop_mlp.py \\
        --patched autotune-out/loop_mlp/loop_mlp_tuned.py \\
        --args "--epochs 3" --tuned-args "--epochs 3 --batch-size 256 --workers 2" \\
        --tuned-env "OMP_NUM_THREADS=2" --repeats 5 --json speedup.json

Original:  PYTHON SCRIPT ARGS             with this shell's environment.
Tuned:     PYTHON PATCHED TUNED-ARGS      with this shell's environment plus TUNED-ENV.

Or, from what autotune wrote, applied as a user applies it:

    python bench/loop_speedup.py --from autotune-out/loop_mlp --repeats 5

reads the script and its arguments from run_tuned.json ("script_tuned", "argv", "tuned_argv"),
applies tuned.patch with `git apply` to a copy of the script in a temporary folder, and takes
the environment from the `export K=V` lines of tuned_arguments.md.

The runs go original, tuned, original, tuned, ... (one pair per repeat), one at a time.
Every ``samples/s X`` the script prints is collected; a run's rate is the median of its
figures. The speedup is the median of the per-pair ratios tuned/original, with a 95%
interval: a percentile bootstrap over the pairs (fixed seed) when there are 5 or more
pairs, otherwise just the smallest and largest pair ratio. Only the standard library is
used, so nothing here shares a bug with autotune's own measurement.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile

RATE = re.compile(r"samples/s ([0-9.]+)")
BOOTSTRAP_MIN_PAIRS = 5
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def parse_env(text: str) -> dict[str, str]:
    """'K=V K2="a b"' -> {'K': 'V', 'K2': 'a b'}."""
    env = {}
    for item in shlex.split(text):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"--tuned-env: expected KEY=VALUE, got {item!r}")
        env[key] = value
    return env


def run_once(command: list[str], env: dict[str, str], timeout: float,
             metric: str | None = None) -> tuple[float, list[float], float | None]:
    """Run the script to the end; return (median of its samples/s figures, all of them, the last
    value of ``metric`` it printed)."""
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    figures = [float(x) for x in RATE.findall(proc.stdout)]
    if proc.returncode != 0 or not figures:
        why = f"exit status {proc.returncode}" if proc.returncode != 0 else "no 'samples/s X' in its output"
        raise SystemExit(f"{shlex.join(command)}: {why}\n{output[-3000:]}")
    found = re.findall(metric, proc.stdout) if metric else []
    return statistics.median(figures), figures, float(found[-1]) if found else None


def interval(ratios: list[float]) -> tuple[float, float, str]:
    """95% interval for the median pair ratio, and how it was made."""
    if len(ratios) < BOOTSTRAP_MIN_PAIRS:
        method = f"min/max of the {len(ratios)} pair ratio(s) (fewer than {BOOTSTRAP_MIN_PAIRS} pairs)"
        return min(ratios), max(ratios), method
    rng = random.Random(BOOTSTRAP_SEED)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(BOOTSTRAP_RESAMPLES))
    lo = medians[int(0.025 * BOOTSTRAP_RESAMPLES)]
    hi = medians[int(0.975 * BOOTSTRAP_RESAMPLES) - 1]
    method = (f"percentile bootstrap of the median over {len(ratios)} pairs "
              f"({BOOTSTRAP_RESAMPLES} resamples, seed {BOOTSTRAP_SEED})")
    return lo, hi, method


def from_output(out: str, tmp: str) -> tuple[str, str, str, str, str]:
    """(script, patched copy, args, tuned args, tuned env) from autotune's output folder ``out``."""
    with open(os.path.join(out, "run_tuned.json")) as f:
        settings = json.load(f)
    script = settings["script_tuned"]
    patched = os.path.join(tmp, os.path.basename(script))
    shutil.copy(script, patched)
    patch = os.path.join(out, "tuned.patch")
    if os.path.exists(patch):
        subprocess.run(["git", "apply", os.path.abspath(patch)], cwd=tmp, check=True)
    with open(os.path.join(out, "tuned_arguments.md")) as f:
        exports = [line.strip().removeprefix("export ") for line in f if line.strip().startswith("export ")]
    return script, patched, shlex.join(settings["argv"]), shlex.join(settings["tuned_argv"]), " ".join(exports)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="out", metavar="OUT", help="autotune's output folder: the rest from it")
    p.add_argument("--script", help="the user's script as written")
    p.add_argument("--patched", help="the tuned copy of the script (default: --script itself)")
    p.add_argument("--args", default="", help="the original arguments, as one shell-quoted string")
    p.add_argument("--tuned-args", default=None, help="the arguments of the tuned run (default: --args)")
    p.add_argument("--tuned-env", default="", help="extra environment of the tuned run: 'K=V K2=V2'")
    p.add_argument("--repeats", type=int, default=5, help="number of (original, tuned) pairs")
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds allowed for one run")
    p.add_argument("--json", metavar="FILE", help="also write the results here")
    p.add_argument("--metric", metavar="REGEX", help="a metric the script prints (its last value in a run is "
                   "reported beside the rates), e.g. 'val_acc ([0-9.]+)'")
    args = p.parse_args()
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    tmp = tempfile.mkdtemp(prefix="loop-speedup-")
    if args.out:
        args.script, args.patched, args.args, args.tuned_args, args.tuned_env = from_output(args.out, tmp)
    elif not args.script:
        p.error("give --script, or --from OUT")

    original_cmd = [args.python, args.script, *shlex.split(args.args)]
    tuned_args = args.args if args.tuned_args is None else args.tuned_args
    tuned_cmd = [args.python, args.patched or args.script, *shlex.split(tuned_args)]
    extra_env = parse_env(args.tuned_env)
    original_env = dict(os.environ)
    tuned_env = {**original_env, **extra_env}

    print(f"original: {shlex.join(original_cmd)}")
    env_prefix = "".join(f"{k}={shlex.quote(v)} " for k, v in extra_env.items())
    print(f"tuned:    {env_prefix}{shlex.join(tuned_cmd)}")
    pairs: list[dict[str, object]] = []
    ratios: list[float] = []
    for i in range(args.repeats):
        orig_rate, orig_figures, orig_metric = run_once(original_cmd, original_env, args.timeout, args.metric)
        tuned_rate, tuned_figures, tuned_metric = run_once(tuned_cmd, tuned_env, args.timeout, args.metric)
        ratio = tuned_rate / orig_rate
        ratios.append(ratio)
        pairs.append({"original": orig_rate, "tuned": tuned_rate, "ratio": ratio,
                      "original_figures": orig_figures, "tuned_figures": tuned_figures,
                      "original_metric": orig_metric, "tuned_metric": tuned_metric})
        said = f"   metric {orig_metric} -> {tuned_metric}" if args.metric else ""
        print(f"pair {i + 1}: original {orig_rate:10.1f} samples/s   tuned {tuned_rate:10.1f} samples/s"
              f"   ratio {ratio:.3f}{said}", flush=True)

    speedup = statistics.median(ratios)
    lo, hi, method = interval(ratios)
    print(f"speedup (median tuned/original): {speedup:.3f}x   95% interval [{lo:.3f}, {hi:.3f}]")
    print(f"interval: {method}")

    if args.json:
        result = {"original_command": original_cmd, "tuned_command": tuned_cmd, "tuned_env": extra_env,
                  "pairs": pairs, "speedup": speedup, "interval": [lo, hi], "interval_method": method}
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
