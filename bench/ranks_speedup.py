"""The speedup of a script's tuned launch, measured with no code of autotune's: two shell
commands (the script as the user runs it, and as the answer says: its flags, its environment,
torchrun for several ranks) run alone, alternating (B T, T B, ...), each training's rate read
from what the script prints (``--rate``: a regular expression whose group is a number of
samples per second, its last match in the output). Prints each pair and the median ratio,
with a distribution-free interval (order statistics of the pairs' ratios).

    python bench/ranks_speedup.py --pairs 6 \\
        --rate "'train_samples_per_second': '?([0-9.]+)" \\
        --baseline "python examples/hf_trainer_parsed.py --output_dir /tmp/o --max_steps 60" \\
        --tuned "OMP_NUM_THREADS=1 torchrun --nproc-per-node 2 examples/hf_trainer_parsed.py ... --ddp_backend gloo"
"""
from __future__ import annotations

import argparse
import math
import re
import statistics
import subprocess
import sys
import time


def rate(command: str, pattern: re.Pattern[str], *, after_exit: bool = False) -> float:
    """The last rate ``command`` printed; it must exit 0, unless ``after_exit`` (a rate printed,
    then a failed exit: said, and counted)."""
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=3600)
    text = proc.stdout + proc.stderr
    found = pattern.findall(text)
    if not found or (proc.returncode != 0 and not after_exit):
        raise SystemExit(f"{command!r} failed ({proc.returncode}) or printed no rate:\n{text[-3000:]}")
    if proc.returncode != 0:
        last = [line for line in text.splitlines() if line.strip()][-12:]
        print(f"  exited {proc.returncode} after printing its rate: {' | '.join(last)[:400]}", flush=True)
    return float(found[-1])


def interval(ratios: list[float]) -> tuple[float, float, float]:
    """The narrowest order-statistic interval for the median of ``ratios`` (the k-th smallest to
    the k-th largest) that covers it with at least 90%, and its coverage."""
    n, xs = len(ratios), sorted(ratios)
    best = (xs[0], xs[-1], 1 - 2 * 0.5 ** n)
    for k in range(1, n // 2 + 1):
        coverage = 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2 ** n
        if coverage < 0.9:
            break
        best = (xs[k - 1], xs[n - k], coverage)
    return best


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--baseline", required=True, help="the script as the user runs it (a shell command)")
    p.add_argument("--tuned", required=True, help="the script as the answer launches it (a shell command)")
    p.add_argument("--rate", required=True, help="a regular expression whose group is the samples/s printed")
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--rate-after-exit", action="store_true",
                   help="count a rate printed before a failed exit (said for each such run)")
    args = p.parse_args()
    pattern = re.compile(args.rate)
    ratios = []
    for i in range(args.pairs):
        order = ("baseline", "tuned") if i % 2 == 0 else ("tuned", "baseline")
        got = {}
        for which in order:
            start = time.monotonic()
            got[which] = rate(getattr(args, which), pattern, after_exit=args.rate_after_exit)
            print(f"pair {i + 1}: {which} {got[which]:.1f} samples/s ({time.monotonic() - start:.0f} s)", flush=True)
        ratios.append(got["tuned"] / got["baseline"])
        print(f"pair {i + 1}: {ratios[-1]:.3f}x", flush=True)
    low, high, coverage = interval(ratios)
    print(f"tuned against baseline: median {statistics.median(ratios):.2f}x ({low:.2f}-{high:.2f}, "
          f"{coverage:.0%} interval), {args.pairs} pairs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
