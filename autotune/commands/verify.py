"""``autotune verify OUTDIR``: re-run the verification of a tuned configuration, here.

Useful later, or on another machine: it warns when this machine's fingerprint
differs from the one the configuration was tuned on.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from autotune import measure_lock, outdir, proctree, verify
from autotune.commands.run import add_common
from autotune.config import TrialConfig
from autotune.pipeline import (
    EXIT_NOT_VERIFIED,
    EXIT_VERIFIED,
    candidate_emitter,
    make_runner,
    probe_doc,
)
from autotune.report import Reporter
from autotune.result import read_document
from autotune.task import load_task


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("verify", help="re-check a tuned configuration on this machine",
                       description=__doc__)
    p.add_argument("out", type=Path, metavar="OUTDIR")
    add_common(p)
    p.set_defaults(handler=main)


def main(args: argparse.Namespace) -> int:
    from autotune.probes import fingerprint, fingerprint_diff

    reporter = Reporter()
    doc = read_document(args.out)
    out = (args.out if args.out.is_dir() else args.out.parent).absolute()
    task = load_task(doc["model_file"])
    cfg = TrialConfig.from_dict(doc["config"])
    baseline = TrialConfig.from_dict(doc["baseline"]["config"])
    machine = probe_doc()
    tuned_on = {k: v for k, v in doc.get("fingerprint", {}).items() if k != "id"}
    for line in fingerprint_diff(tuned_on, fingerprint(machine)):
        reporter.warn(f"this machine differs from the one the config was tuned on: {line}")
    if cfg == baseline:
        reporter.info("the configuration is the baseline itself: nothing to verify")
        return EXIT_NOT_VERIFIED
    proctree.become_subreaper()
    try:
        with outdir.exclusive(out), measure_lock.held(notice=reporter.warn):
            runner = make_runner(task, machine, out, window_s=args.window, windows=args.windows,
                                 trial_timeout_s=args.trial_timeout,
                                 hang_timeout_s=args.hang_timeout)
            emit_baseline = candidate_emitter(task, machine)
            winner, verdicts, base_speed = verify.verify_candidates(
                runner, baseline=baseline, candidates=[cfg],
                settings=verify.Settings(rounds=args.rounds, pairs=args.pairs,
                                         pair_seconds=args.pair_seconds,
                                         max_quality_drop=args.max_quality_drop),
                has_evaluate=task.has_evaluate,
                # the user's launch.sh as it is; the baseline's script written afresh
                emit_candidate=lambda c, folder: (Path(doc["outputs"]["launcher"]) if c == cfg
                                                  else emit_baseline(c, folder)),
                workdir=out / "reverify", progress=reporter.verify)
    finally:
        proctree.reap_orphans()
    verdict = verdicts[0]
    now = verdict.standalone
    printed = doc.get("speedup") or {}
    result = {"verified": winner is not None,
              "baseline_samples_per_s": now.get("baseline_median_samples_per_s",
                                                base_speed.get("median_samples_per_s")),
              "speedup": {k: now.get(k) for k in ("median", "ci_low", "ci_high", "ci_level",
                                                  "pairs")},
              "printed_when_tuned": {k: printed.get(k) for k in ("median", "ci_low", "ci_high")},
              "verification": verdict.to_dict(), "fingerprint_differs": bool(
                  fingerprint_diff(tuned_on, fingerprint(machine)))}
    outside = outside_printed(now, printed)
    if outside:
        result["outside_printed_interval"] = outside
    (out / "reverify.json").write_text(json.dumps(result, indent=2) + "\n")
    if args.json:
        print(json.dumps(result, indent=2))
    elif winner:
        reporter.info(f"verified again: speedup {now['median']:.2f}x over {now['pairs']} pairs of "
                      f"standalone runs (a re-run lands in {now['ci_low']:.2f}-"
                      f"{now['ci_high']:.2f}x, {now['ci_level']:.0%})")
    else:
        reporter.info(f"not verified here: {verdict.reason}")
    if outside:
        reporter.warn(outside)
    return EXIT_VERIFIED if winner else EXIT_NOT_VERIFIED


def outside_printed(now: dict, printed: dict) -> str | None:
    """A plain sentence when the speedup measured now lies outside the interval printed
    when the configuration was tuned; None when inside (or nothing to compare)."""
    if not now.get("median") or not printed.get("ci_low") or not printed.get("pairs"):
        return None
    low, high, median = printed["ci_low"], printed["ci_high"], now["median"]
    if low <= median <= high:
        return None
    side = "below" if median < low else "above"
    return (f"the speedup measured now, {median:.2f}x, is {side} the interval printed when this "
            f"configuration was tuned ({low:.2f}-{high:.2f}x, median {printed['median']:.2f}x): "
            "this machine runs the two scripts differently now (its load, its other tenants, or "
            "what changed since) - trust today's figure, and tune again if it matters")
