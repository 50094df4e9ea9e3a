"""Verification: the search's winner is a claim; these four checks test it (DESIGN §6).

1. speed     the candidates and the baseline re-measured in alternation, round after
             round; the speedup is the ratio within a round, with a confidence interval.
2. numerics  from the same seed, weights and global batches, the candidate's losses
             must track an fp32, one-process, eager reference at the same batch size.
3. quality   where a knob trades quality (pruning, reduced precision) and the model
             file has evaluate(), the metric after an identical short training must
             stay within the allowed drop.
4. script    the emitted launch.sh must train as fast as the trial measured.
"""
from __future__ import annotations

import dataclasses
import json
import math
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autotune import measure_lock, proctree
from autotune.config import TrialConfig
from autotune.trial import LiveTrial, TrialRunner

NUMERICS_TOLERANCE = {"fp32": 0.02, "tf32": 0.05, "bf16": 0.15, "fp16": 0.15}


def median_interval(values: list[float], *, confidence: float = 0.9) -> tuple[float, float, float]:
    """Distribution-free interval for the median: the order statistics x(k), x(n-k+1)
    with the largest k whose coverage (sign test) is still >= ``confidence``.
    One disturbed round on a shared machine moves it by one order statistic, where it
    would blow up a t-interval. Returns (low, high, actual coverage)."""
    xs = sorted(values)
    n = len(xs)

    def coverage(k: int) -> float:  # P(x(k) <= median <= x(n-k+1))
        return 1 - 2 * sum(math.comb(n, i) for i in range(k)) / 2**n

    k = 1
    while k + 1 <= (n + 1) // 2 and coverage(k + 1) >= confidence:
        k += 1
    return xs[k - 1], xs[n - k], coverage(k)


def paired_ratio(num: list[float], den: list[float]) -> dict[str, float]:
    """``num`` over ``den``, window against window of the same round: median and interval."""
    return ratio_interval([a / b for a, b in zip(num, den)])


def ratio_interval(ratios: list[float], *, confidence: float = 0.9) -> dict[str, float]:
    """Median speedup over the rounds and its distribution-free interval."""
    low, high, level = median_interval(ratios, confidence=confidence)
    return {"median": statistics.median(ratios), "ci_low": low, "ci_high": high,
            "ci_level": level, "rounds": len(ratios)}


@dataclasses.dataclass
class Check:
    passed: bool | None  # None: not applicable
    detail: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"passed": self.passed, **self.detail}


Progress = Callable[[str, dict[str, Any]], None]


def speed_check(
    runner: TrialRunner, baseline: TrialConfig, candidates: list[TrialConfig], *,
    rounds: int, progress: Progress = lambda kind, info: None,
) -> tuple[dict[str, Any], list[Check]]:
    """Baseline and candidates held alive, warmed up and idle, then measured one window
    each in turn (B C1 C2, C1 C2 B, ... rotating), round after round. A round's ratio
    compares windows taken seconds apart, so drift on a shared machine cancels out.

    They start one at a time: setting one up never overlaps measuring another."""
    configs = [baseline, *candidates]
    live: list[LiveTrial | None] = []
    failures: list[str | None] = [None] * len(configs)
    values: list[list[float]] = [[] for _ in configs]
    try:
        for i, cfg in enumerate(configs):
            progress("step", {"text": f"starting {'baseline' if i == 0 else f'candidate {i}'}: "
                                      f"{cfg.short()}"})
            trial = runner.start(cfg, name=f"verify-speed-{i}", mode={"mode": "serve"})
            if not trial.wait_ready():
                failures[i] = trial.result.describe_failure()
                live.append(None)
                continue
            live.append(trial)
        if live[0] is None:
            raise RuntimeError(f"the baseline failed during verification: {failures[0]}")
        for r in range(rounds):
            progress("speed", {"round": r + 1, "rounds": rounds})
            shift = r % len(configs)
            for i in list(range(len(configs)))[shift:] + list(range(len(configs)))[:shift]:
                trial = live[i]
                if trial is None:
                    continue
                value = trial.window()
                if value is None:
                    failures[i] = trial.result.describe_failure()
                    live[i] = None
                    if i == 0:
                        raise RuntimeError(f"the baseline failed during verification: {failures[0]}")
                    continue
                values[i].append(value)
    finally:
        for trial in live:
            if trial is not None:
                trial.kill()
    base_values = values[0][: len(values[0])]
    checks = []
    for i in range(1, len(configs)):
        if failures[i]:
            checks.append(Check(False, {"reason": f"failed when re-measured: {failures[i]}"}))
            continue
        ratios = [v / b for v, b in zip(values[i], base_values)]
        stats = ratio_interval(ratios)
        passed = stats["ci_low"] > 1.0
        detail = {**stats, "ratios": ratios, "samples_per_s": values[i],
                  "median_samples_per_s": statistics.median(values[i])}
        if not passed:
            detail["reason"] = (
                f"not faster than the baseline: speedup {stats['median']:.2f}x, "
                f"{stats['ci_level']:.0%} interval {stats['ci_low']:.2f}-{stats['ci_high']:.2f}x "
                "includes 1.0"
            )
        checks.append(Check(passed, detail))
    return {"samples_per_s": base_values, "median_samples_per_s": statistics.median(base_values)}, checks


def numerics_reference(baseline: TrialConfig, cand: TrialConfig) -> TrialConfig:
    """fp32, one process, eager, default threads, at the candidate's batch size and
    pruning: what the candidate must compute the same as."""
    return baseline.replace(batch_size=cand.batch_size, prune_ratio=cand.prune_ratio)


def compare_losses(reference: list[float], candidate: list[float], *, tolerance: float) -> Check:
    if not candidate or any(not math.isfinite(v) for v in candidate):
        return Check(False, {"reason": "the loss became NaN or infinite"})
    n = min(len(reference), len(candidate))
    diffs = [abs(a - b) / max(abs(a), 1e-3) for a, b in zip(reference[:n], candidate[:n])]
    worst = max(diffs)
    detail = {"steps": n, "max_relative_difference": worst, "tolerance": tolerance,
              "reference_losses": reference[:n], "candidate_losses": candidate[:n]}
    if worst > tolerance:
        step = diffs.index(worst)
        detail["reason"] = (
            f"losses diverge from the fp32 reference: step {step} loss {candidate[step]:.4g} vs "
            f"{reference[step]:.4g} (relative difference {worst:.3f} > tolerance {tolerance})"
        )
        return Check(False, detail)
    return Check(True, detail)


def numerics_check(runner: TrialRunner, baseline: TrialConfig, cand: TrialConfig, *, steps: int,
                   cache: dict[str, list[float]]) -> Check:
    ref_cfg = numerics_reference(baseline, cand)
    key = json.dumps(ref_cfg.to_dict(), sort_keys=True)
    if key not in cache:
        ref = runner.run(ref_cfg, name=f"verify-numerics-ref-{len(cache)}", trajectory_steps=steps)
        if ref.status != "ok":
            return Check(False, {"reason": f"the fp32 reference failed: {ref.describe_failure()}"})
        cache[key] = ref.losses
    res = runner.run(cand, name=f"verify-numerics-{len(cache)}-{cand.layout}", trajectory_steps=steps)
    if res.status != "ok":
        return Check(False, {"reason": f"the candidate failed: {res.describe_failure()}"})
    return compare_losses(cache[key], res.losses, tolerance=NUMERICS_TOLERANCE[cand.precision])


def trades_quality(cand: TrialConfig) -> bool:
    return cand.prune_ratio > 0 or cand.precision in ("bf16", "fp16")


def quality_check(runner: TrialRunner, baseline: TrialConfig, cand: TrialConfig, *,
                  has_evaluate: bool, max_drop: float | None, samples: int) -> Check:
    if not trades_quality(cand):
        return Check(None, {"reason": "no knob of this configuration trades quality"})
    if not has_evaluate:
        return Check(False, {"reason": "the configuration trades quality but the model file has "
                                       "no evaluate(model) to check it with"})
    if max_drop is None:
        return Check(False, {"reason": "the configuration trades quality; allow a drop with "
                                       "--max-quality-drop to accept it"})
    scores = {}
    for role, cfg in (("baseline", baseline), ("candidate", cand)):
        steps = max(1, samples // cfg.batch_size)
        res = runner.run(cfg, name=f"verify-quality-{role}-{cand.layout}-{cand.batch_size}",
                         quality_steps=steps)
        if res.status != "ok" or res.done.get("metric") is None:
            return Check(False, {"reason": f"{role} training for the quality check failed: "
                                           f"{res.describe_failure()}"})
        scores[role] = float(res.done["metric"])
    drop = scores["baseline"] - scores["candidate"]
    detail = {"baseline_metric": scores["baseline"], "candidate_metric": scores["candidate"],
              "drop": drop, "max_drop": max_drop, "training_samples": samples}
    if drop > max_drop:
        detail["reason"] = f"quality dropped by {drop:.4g} (allowed {max_drop})"
        return Check(False, detail)
    return Check(True, detail)


def run_launcher(launcher: Path, *, steps: int, workdir: Path, timeout_s: float) -> dict[str, Any]:
    """Run an emitted launch.sh for a few steps; returns its JSON report."""
    workdir.mkdir(parents=True, exist_ok=True)
    report = workdir / "script-report.json"
    report.unlink(missing_ok=True)
    log = workdir / "script-log.txt"
    argv = ["bash", str(launcher.absolute()), "--max-steps", str(steps), "--no-checkpoint",
            "--log-every", str(max(1, steps)), "--report", str(report)]
    with open(log, "wb") as out, measure_lock.held():
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=str(workdir),
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            pass
        finally:
            proctree.kill_tree(proc.pid)
            proc.wait()
    if proc.returncode != 0 or not report.exists():
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise RuntimeError(f"{launcher.name} failed (exit code {proc.returncode}):\n{tail}")
    return json.loads(report.read_text())


def script_check(launcher: Path, *, expected: float, noise: float, steps: int, workdir: Path,
                 timeout_s: float) -> Check:
    """The script must reach the trial's throughput, within the measured noise."""
    try:
        report = run_launcher(launcher, steps=steps, workdir=workdir, timeout_s=timeout_s)
    except RuntimeError as exc:
        return Check(False, {"reason": str(exc)})
    got = report.get("samples_per_s") or 0.0
    tolerance = script_tolerance(noise)
    ratio = got / expected if expected else 0.0
    detail = {"samples_per_s": got, "trial_samples_per_s": expected, "ratio": ratio,
              "tolerance": tolerance, "steps": steps}
    if ratio < 1 - tolerance:
        detail["reason"] = (
            f"the generated script trains at {got:.1f} samples/s, {ratio:.2f}x of the "
            f"{expected:.1f} measured for the configuration (allowed down to {1 - tolerance:.2f}x)"
        )
        return Check(False, detail)
    return Check(True, detail)


def script_tolerance(noise: float) -> float:
    """How far below its trial's rate the script may train: twice the windows' spread, at
    least 20% (a few seconds of a fresh script against warmed-up windows), at most 35%: a
    noisy candidate's spread reached 30% (pipeline_bound), and twice that would pass a
    script running at 40% of the rate that was verified."""
    return min(0.35, max(0.2, 2 * noise))


def rank_by_rounds(verdicts: list[Verdict]) -> list[Verdict]:
    """Fastest first, judged round by round against the candidates' own level (the
    geometric mean of their windows in that round), not against the baseline's window:
    candidates close to each other are told apart by windows taken seconds apart, and
    one noisy baseline window no longer moves them all. Candidates whose re-measurement
    failed come last."""
    measured = [v for v in verdicts if v.speed.get("samples_per_s")]
    if not measured:
        return list(verdicts)
    rounds = min(len(v.speed["samples_per_s"]) for v in measured)
    level = [math.exp(statistics.fmean(math.log(max(v.speed["samples_per_s"][t], 1e-9)) for v in measured))
             for t in range(rounds)]
    for v in measured:
        v.speed["relative_to_candidates"] = statistics.median(
            v.speed["samples_per_s"][t] / level[t] for t in range(rounds))
    return sorted(verdicts, key=lambda v: v.speed.get("relative_to_candidates", 0.0), reverse=True)


def outcomes(verdicts: list[Verdict], winner: Verdict | None) -> list[dict[str, Any]]:
    """Every candidate's re-measured speed and what became of it, in the order they were
    tried: with the passed-but-not-chosen ones kept, the verification order can be
    audited afterwards (which candidate a different order would have emitted)."""
    out = []
    for v in rank_by_rounds(verdicts):
        if v is winner:
            outcome = "emitted"
        elif not v.passed:
            outcome = f"rejected: {v.reason}"
        else:  # only the speed check: verification stops at the first to pass them all
            outcome = "faster than the baseline; not checked further, one tried earlier was emitted"
        out.append({"config_short": v.config.short(), "config": v.config.to_dict(),
                    **{k: v.speed.get(k) for k in ("median", "ci_low", "ci_high",
                                                   "relative_to_candidates")},
                    "checks": sorted(v.checks), "outcome": outcome})
    return out


def relative_spread(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4)
    return (q[2] - q[0]) / statistics.median(values)


def script_steps(expected: float, batch_size: int, *, seconds: float = 4.0) -> int:
    """Enough steps for a few seconds of timed training after the script's warm-up."""
    return 3 + max(10, int(seconds * expected / batch_size))



@dataclasses.dataclass
class Settings:
    rounds: int = 10
    numerics_steps: int = 12
    quality_samples: int = 6400
    max_quality_drop: float | None = None
    script_timeout_s: float = 300.0


@dataclasses.dataclass
class Verdict:
    config: TrialConfig
    checks: dict[str, Check]
    speed: dict[str, Any]

    @property
    def passed(self) -> bool:
        return all(c.passed is not False for c in self.checks.values())

    @property
    def reason(self) -> str:
        return "; ".join(f"{name}: {c.detail.get('reason', 'failed')}"
                         for name, c in self.checks.items() if c.passed is False)

    def to_dict(self) -> dict[str, Any]:
        return {name: c.to_dict() for name, c in self.checks.items()}


def verify_candidates(
    runner: TrialRunner, *, baseline: TrialConfig, candidates: list[TrialConfig],
    settings: Settings, has_evaluate: bool,
    emit_candidate: Callable[[TrialConfig, Path], Path], workdir: Path,
    progress: Progress = lambda kind, info: None,
) -> tuple[Verdict | None, list[Verdict], dict[str, Any]]:
    """Check candidates fastest-first; the first to pass all four checks wins.
    ``emit_candidate(cfg, folder)`` writes a candidate's launch.sh and returns its path."""
    base_speed, speed_checks = speed_check(runner, baseline, candidates, rounds=settings.rounds,
                                           progress=progress)
    verdicts = [Verdict(c, {"speed": s}, s.detail) for c, s in zip(candidates, speed_checks)]
    order = rank_by_rounds(verdicts)
    losses_cache: dict[str, list[float]] = {}
    for i, verdict in enumerate(order):
        if not verdict.passed:
            continue
        cfg = verdict.config
        progress("step", {"text": f"numerics of {cfg.short()}"})
        verdict.checks["numerics"] = numerics_check(runner, baseline, cfg,
                                                    steps=settings.numerics_steps, cache=losses_cache)
        if not verdict.passed:
            continue
        progress("step", {"text": f"quality of {cfg.short()}"})
        verdict.checks["quality"] = quality_check(
            runner, baseline, cfg, has_evaluate=has_evaluate,
            max_drop=settings.max_quality_drop, samples=settings.quality_samples)
        if not verdict.passed:
            continue
        progress("step", {"text": f"the generated script of {cfg.short()}"})
        folder = workdir / f"candidate-{i}"
        launcher = emit_candidate(cfg, folder)
        expected = verdict.speed["median_samples_per_s"]
        verdict.checks["script"] = script_check(
            launcher, expected=expected, noise=relative_spread(verdict.speed["samples_per_s"]),
            steps=script_steps(expected, cfg.batch_size), workdir=folder,
            timeout_s=settings.script_timeout_s)
        if verdict.passed:
            return verdict, verdicts, base_speed
    return None, verdicts, base_speed
