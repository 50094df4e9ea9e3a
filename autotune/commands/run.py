"""``autotune run FILE``: probe, search, verify, emit."""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

from autotune import __version__, emit, launch, measure_lock, outdir, proctree, verify
from autotune.config import TrialConfig
from autotune.errors import NotVerified, UsageError
from autotune.report import Reporter
from autotune.search import Tuner, open_study, storage_path, study_name
from autotune.space import Space, build_space, parse_fixes
from autotune.task import Task, load_task
from autotune.trial import FAILURE_HELP, Measurement, TrialRunner

EXIT_VERIFIED = 0
EXIT_NOT_VERIFIED = 3


def _positive(kind: type, name: str):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be positive, got {text}")
        return value
    return parse


def add_common(p: argparse.ArgumentParser) -> None:
    """Options shared by run and verify: how trials are measured and verified."""
    p.add_argument("--window", type=_positive(float, "--window"), default=1.0,
                   help="seconds per measurement window (default 1.0)")
    p.add_argument("--windows", type=_positive(int, "--windows"), default=3,
                   help="measurement windows per trial (default 3)")
    p.add_argument("--trial-timeout", type=_positive(float, "--trial-timeout"), default=300.0,
                   help="seconds before a trial is killed (default 300)")
    p.add_argument("--rounds", type=_positive(int, "--rounds"), default=10,
                   help="alternating re-measurement rounds in verification (default 10)")
    p.add_argument("--max-quality-drop", type=float, default=None, metavar="X",
                   help="allow knobs that trade quality (pruning, reduced precision) if the "
                        "evaluate() metric drops by at most X")
    p.add_argument("--json", action="store_true", help="print the result document as JSON")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="tune a model file and emit the fastest verified config",
                       description=__doc__)
    p.add_argument("model_file", metavar="FILE", help="your model file (see the README's contract)")
    p.add_argument("--trials", type=_positive(int, "--trials"), default=20,
                   help="measured trials in the search (default 20)")
    p.add_argument("--timeout", type=_positive(float, "--timeout"), default=None, metavar="SECONDS",
                   help="stop starting new trials after this many seconds")
    p.add_argument("--out", type=Path, default=None,
                   help="output folder (default autotune-out/<model name>)")
    p.add_argument("--fix", action="append", default=[], metavar="KNOB=VALUE",
                   help="pin a knob, e.g. --fix batch_size=64 (repeatable)")
    p.add_argument("--top", type=_positive(int, "--top"), default=2,
                   help="best-ranked candidates re-measured in verification, besides the first one's "
                        "layout contrast and the best of the other process layout (default 2)")
    add_common(p)
    p.set_defaults(handler=main)


def probe_doc() -> dict[str, Any]:
    from probes import probe_machine

    return probe_machine().to_dict()


def memory_limit(machine: dict[str, Any]) -> int | None:
    """A trial may use most of what is free, never all: the kernel's OOM killer must
    never have to choose (it might choose the tuner or the user's desktop)."""
    usable = (machine.get("memory") or {}).get("usable_bytes")
    return int(usable * 0.8) if usable else None


def make_runner(task: Task, machine: dict[str, Any], out: Path, args: argparse.Namespace) -> TrialRunner:
    return TrialRunner(
        model_file=task.path, machine=machine, workdir=out / "trials",
        measurement=Measurement(window_s=args.window, windows=args.windows),
        timeout_s=args.trial_timeout, memory_limit_bytes=memory_limit(machine),
    )


def heuristics(space: Space, machine: dict[str, Any]) -> list[TrialConfig]:
    """PyTorch's CPU launcher defaults: one process on all usable cores, tcmalloc or
    jemalloc preloaded where found, compact core pinning."""
    if space.baseline.device != "cpu":
        return []
    cores = int((machine.get("cpu") or {}).get("usable_cores") or 1)
    params = {k: v[0] for k, v in space.choices.items()}
    params.update(layout=f"1x{cores}", batch_size=space.baseline.batch_size, num_workers=0)
    if params["layout"] not in space.choices["layout"]:
        return []
    allocators = space.choices.get("allocator", [])
    for name in ("tcmalloc", "jemalloc"):
        if name in allocators:
            params["allocator"] = name
            break
    if "compact" in space.choices.get("affinity", []):
        params["affinity"] = "compact"
    return [space.config_from_params(params)]


def layout_contrast(top: TrialConfig, space: Space, machine: dict[str, Any]) -> TrialConfig | None:
    """The top candidate with the other process layout (several ranks <-> one process
    on all cores), every other knob equal: verification measures it alongside, which
    gives the layout's own effect with an interval."""
    if top.device != "cpu":
        return None
    cores = int((machine.get("cpu") or {}).get("usable_cores") or 1)
    if top.nprocs > 1:
        other = top.replace(nprocs=1, threads=cores)
    else:
        ranks = next((int(s.split("x")[0]) for s in space.choices["layout"]
                      if int(s.split("x")[0]) > 1 and int(s.split("x")[1]) == 1), None)
        if ranks is None or top.batch_size % ranks:
            return None
        other = top.replace(nprocs=ranks, threads=cores // ranks)
    return other if f"{other.nprocs}x{other.threads}" in space.choices["layout"] else None


def choose_candidates(ranked: list[TrialConfig], *, top: int, space: Space,
                      machine: dict[str, Any]) -> list[TrialConfig]:
    """What verification re-measures: the ``top`` best by search value; the first one's
    layout contrast; and, when the top ones are all several-rank or all one-process, the
    best-measured configuration of the other kind.

    Why the last: a search trial's value is one process measured once, and on a shared
    machine that drifts by as much as the top configurations differ (the baseline of
    bench/workloads/tiny_lm.py measured 445, 512 and 558 samples/s in three searches);
    verification's alternating windows resolve such differences, so it gets the best
    representative of the other process layout, whose cost profile differs most."""
    candidates = ranked[:top]
    if not candidates:
        return []
    contrast = layout_contrast(candidates[0], space, machine)
    if contrast is not None and contrast not in candidates:
        candidates.append(contrast)
    kinds = {c.nprocs > 1 for c in ranked[:top]}
    other = next((c for c in ranked if (c.nprocs > 1) not in kinds), None)
    if other is not None and other not in candidates:
        candidates.append(other)
    return candidates


def layout_effect(verdicts: list[verify.Verdict], top: TrialConfig,
                  contrast: TrialConfig | None) -> dict[str, Any] | None:
    by_cfg = {v.config: v.speed for v in verdicts}
    if contrast is None or top not in by_cfg or contrast not in by_cfg:
        return None
    a, b = by_cfg[top].get("samples_per_s"), by_cfg[contrast].get("samples_per_s")
    if not a or not b:
        return None
    multi, single = (a, b) if top.nprocs > 1 else (b, a)
    multi_cfg, single_cfg = (top, contrast) if top.nprocs > 1 else (contrast, top)
    stats = verify.paired_ratio(multi, single)
    return {"multi_rank": multi_cfg.layout, "single_process": single_cfg.layout,
            "other_knobs": {k: v for k, v in top.to_dict().items()
                            if k not in ("nprocs", "threads")},
            "ratio": stats["median"], "ci_low": stats["ci_low"], "ci_high": stats["ci_high"],
            "ci_level": stats["ci_level"]}


def candidate_emitter(task: Task, machine: dict[str, Any]):
    def emit_candidate(cfg: TrialConfig, folder: Path) -> Path:
        env, _ = launch.environment(cfg, machine=machine)
        doc = emit.write_outputs(folder, cfg=cfg, model_file=task.path, env=env,
                                 document={"candidate": cfg.to_dict()},
                                 description=f"Train {task.path.name} (candidate)")
        return Path(doc["outputs"]["launcher"])
    return emit_candidate


def build_document(
    *, task: Task, machine: dict[str, Any], space: Space, chosen: TrialConfig,
    baseline_cfg: TrialConfig, base_speed: dict[str, Any], winner: verify.Verdict | None,
    verdicts: list[verify.Verdict], search: dict[str, Any],
) -> dict[str, Any]:
    from probes import fingerprint, fingerprint_id

    base_value = base_speed["median_samples_per_s"]
    doc: dict[str, Any] = {
        "model_file": str(task.path),
        "autotune_version": __version__,
        "fingerprint": {**fingerprint(machine), "id": fingerprint_id(machine)},
        "config": chosen.to_dict(),
        "baseline": {"config": baseline_cfg.to_dict(), "samples_per_s": base_value,
                     "rounds": base_speed["samples_per_s"]},
        "verified": winner is not None,
    }
    if winner is not None:
        sp = winner.speed
        result = search.get("results", {}).get(str(chosen), {})
        doc["best"] = {"samples_per_s": sp["median_samples_per_s"],
                       "peak_mem_mb": result.get("peak_rss_mb"),
                       "one_time_s": result.get("one_time_s")}
        doc["speedup"] = {k: sp[k] for k in ("median", "ci_low", "ci_high", "ci_level", "rounds")}
        doc["verification"] = winner.to_dict()
    else:
        doc["best"] = None
        doc["speedup"] = {"median": 1.0, "ci_low": 1.0, "ci_high": 1.0, "rounds": 0}
        doc["verification"] = {}
    doc["rejected"] = [
        {"config": v.config.to_dict(), "config_short": v.config.short(), "reason": v.reason,
         "checks": v.to_dict()}
        for v in verdicts if v is not winner and not v.passed
    ]
    doc["candidates"] = verify.outcomes(verdicts, winner)
    doc["search"] = {k: v for k, v in search.items() if k != "results"}
    doc["space"] = space.describe()
    return doc


def main(args: argparse.Namespace) -> int:
    reporter = Reporter(quiet=False)
    fixed = parse_fixes(args.fix)
    task_path = Path(args.model_file)
    # Absolute from here on: trials and scripts run with other working directories.
    out = (args.out or Path("autotune-out") / task_path.stem).absolute()
    if args.max_quality_drop is not None and args.max_quality_drop < 0:
        raise UsageError("--max-quality-drop must be 0 or more")
    # Subreaper first: processes the model file starts during its check are ours to end.
    proctree.become_subreaper()
    try:
        with contextlib.ExitStack() as stack:
            if out.is_dir():  # a busy folder is refused before the model file is even checked
                stack.enter_context(outdir.exclusive(out))
            task = load_task(task_path)  # before creating anything: bad input loses nothing
            proctree.reap_orphans()
            if not out.is_dir():
                stack.enter_context(outdir.exclusive(outdir.prepare(out)))
            stack.enter_context(measure_lock.held(notice=reporter.warn))
            return _run(args, task, out, fixed, reporter)
    finally:
        proctree.reap_orphans()


def _run(args: argparse.Namespace, task: Task, out: Path, fixed: dict[str, Any],
         reporter: Reporter) -> int:
    from probes import fingerprint_id

    reporter.info("probing the machine ...")
    machine = probe_doc()
    for w in machine.get("warnings", []):
        reporter.warn(w)
    space = build_space(machine, baseline_batch=task.batch_size, dataset_len=task.dataset_len,
                        image_inputs=task.image_inputs,
                        batchnorm_layers=task.batchnorm_layers, has_evaluate=task.has_evaluate,
                        max_quality_drop=args.max_quality_drop, fixed=fixed)
    for knob, reason in space.describe()["excluded"].items():
        reporter.info(f"  skipping {knob}: {reason}")
    runner = make_runner(task, machine, out, args)
    study = open_study(storage_path=storage_path(out),
                       study_name=study_name(task.path, fingerprint_id(machine)))
    resumed = len(study.trials)
    if resumed:
        reporter.info(f"resuming the study in {out} ({resumed} trials stored)")
    tuner = Tuner(study=study, space=space, runner=runner, trials=args.trials,
                  timeout_s=args.timeout, progress=reporter.search,
                  heuristics=heuristics(space, machine))
    outcome = tuner.run()
    if outcome.baseline is None:
        failed = next((f for f in outcome.failures if f["config"] == space.baseline.to_dict()),
                      outcome.failures[0] if outcome.failures else None)
        detail = (f"{FAILURE_HELP.get(failed['failure'], failed['failure'])}: {failed['message']}"
                  if failed else "it was not measured")
        raise NotVerified(
            "no configuration can be verified: the baseline (your batch size, one process, "
            f"default threads, fp32) failed: {detail}. Fix the model so it trains as it is; "
            f"trial logs are in {out / 'trials'}."
        )
    baseline_cfg = space.baseline
    default_threads = outcome.baseline.result.get("threads_seen")

    def same_as_baseline(cfg: TrialConfig) -> bool:
        # Setting threads to what torch picks by default changes nothing.
        return cfg.replace(threads=None) == baseline_cfg and cfg.threads in (None, default_threads)

    candidates = choose_candidates([c.config for c in outcome.ranked if not same_as_baseline(c.config)],
                                   top=args.top, space=space, machine=machine)
    contrast = layout_contrast(candidates[0], space, machine) if candidates else None
    search_info = {
        "trials": len(study.trials),
        "measured": len(tuner._measured()),
        "failures": outcome.failures,
        "ranking": [{"config": c.config.short(), "samples_per_s": c.value} for c in outcome.ranked[:10]],
        "results": {str(c.config): c.result for c in outcome.ranked},
    }
    settings = verify.Settings(rounds=args.rounds, max_quality_drop=args.max_quality_drop)
    if candidates:
        reporter.info(f"verifying the top {len(candidates)} candidates against the baseline ...")
        winner, verdicts, base_speed = verify.verify_candidates(
            runner, baseline=baseline_cfg, candidates=candidates, settings=settings,
            has_evaluate=task.has_evaluate, emit_candidate=candidate_emitter(task, machine),
            workdir=out / "verify", progress=reporter.verify)
    else:
        winner, verdicts = None, []
        base_speed = {"samples_per_s": [outcome.baseline.value],
                      "median_samples_per_s": outcome.baseline.value}
    chosen = winner.config if winner else baseline_cfg
    doc = build_document(task=task, machine=machine, space=space, chosen=chosen,
                         baseline_cfg=baseline_cfg, base_speed=base_speed, winner=winner,
                         verdicts=verdicts, search=search_info)
    if candidates:
        doc["layout_effect"] = layout_effect(verdicts, candidates[0], contrast)
    env, warnings = launch.environment(chosen, machine=machine)
    for w in warnings:
        reporter.warn(w)
    doc["environment"] = env
    doc = emit.write_outputs(out, cfg=chosen, model_file=task.path, env=env, document=doc,
                             description=f"Train {task.path.name} with the configuration "
                                         "autotune verified on this machine.")
    if args.json:
        json.dump(doc, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        reporter.summary(doc)
    return EXIT_VERIFIED if winner else EXIT_NOT_VERIFIED
