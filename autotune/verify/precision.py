"""What the summary and best_config.json say about precision: how the chosen one was
checked, why the others were not chosen, and how to opt out."""
from __future__ import annotations

from collections.abc import Mapping

from autotune.config import TrialConfig
from autotune.document.measures import PrecisionNote
from autotune.document.quality import QualityJudgement, QualityVerdict
from autotune.runtime.knobs import Precision
from autotune.space import Space
from autotune.verify.verdict import Verdict


def describe_checks(verdict: Verdict, *, scored_by: str = "evaluate()") -> str:
    """One line on how a configuration's precision was checked, for the summary (``scored_by``:
    what scores its quality, ``Task.scored_by``: evaluate(), the printed val_acc...)."""
    cfg = verdict.config
    what = {Precision.FP32: "fp32", Precision.TF32: "tf32 matmuls", Precision.BF16: "bf16 autocast",
            Precision.FP16: "fp16 autocast with GradScaler"}[Precision(cfg.precision)]
    if cfg.prune_ratio:
        what += f", {cfg.prune_ratio:.0%} of channels pruned"
    if cfg.optimizer_step != "default":  # rounding only: checked against the default step's losses
        what += f", {cfg.optimizer_step} optimizer step"
    if cfg.float8:  # judged as bf16 is: against the fp32 reference, and by evaluate()
        what += ", float8 matmuls"
    parts = []
    numerics = verdict.checks.get("numerics")
    if numerics is not None and numerics.passed:
        d = numerics.detail
        ref = d.get("reference") or {}
        where = ("one-process" if ref.get("layout", "1x").startswith("1x")
                 else f"{ref['layout'].split('x')[0]}-rank")
        parts.append(f"losses tracked the fp32 {where} reference within "
                     f"{d['max_difference']:.1%} over {d['steps']} steps"
                     + (f" (at batch {d['checked_at_batch']}, where fp32 fits)"
                        if d.get("checked_at_batch") else ""))
    quality = verdict.checks.get("quality")
    if quality is not None and quality.passed:
        d = quality.detail
        judged = d.get("judgement")
        parts.append(f"{scored_by} {d['candidate_metric']:.4g} vs {d['reference_metric']:.4g} in fp32"
                     + (f", {QualityJudgement.from_json(judged).words()}" if judged else ""))
    elif quality is not None and quality.passed is None and not cfg.exact:
        parts.append("no evaluate() to check quality with" if scored_by == "evaluate()"
                     else "no metric to check quality with")
    return f"{what}: " + ("; ".join(parts) if parts else "not checked")


def precision_note(chosen: TrialConfig, winner: Verdict | None, verdicts: list[Verdict], space: Space, *,
                   exact: bool, searched: Mapping[TrialConfig, float] | None = None,
                   baseline_samples_per_s: float | None = None, scored_by: str = "evaluate()") -> PrecisionNote:
    """Which precision was chosen, how it was checked, why the others were not, and how
    to opt out: what the summary and best_config.json say about precision. ``searched``:
    the samples/s the search measured of each configuration, which says how much faster
    one whose quality check could not tell ran."""
    def label(cfg: TrialConfig) -> str:
        return cfg.precision + (f" pruned {cfg.prune_ratio:g}" if cfg.prune_ratio else "")

    rates = searched or {}
    rejected: dict[str, str] = {}
    inconclusive: dict[str, str] = {}
    judged: dict[str, QualityJudgement] = {}
    for v in verdicts:
        found = v.checks.get("quality")
        if found is not None and found.detail.get("judgement"):
            judged.setdefault(f"{label(v.config)} at batch {v.config.batch_size}",
                              QualityJudgement.from_json(found.detail["judgement"]))
        if v is winner or v.passed or v.config.exact or label(v.config) == label(chosen):
            continue
        failed = {name: c for name, c in v.checks.items() if c.passed is False}
        judgement = failed["quality"].detail.get("judgement") or {} if "quality" in failed else {}
        if set(failed) == {"quality"} and judgement.get("verdict") == QualityVerdict.INCONCLUSIVE:
            faster, rate = "", rates.get(v.config)
            if rate and rates.get(chosen):
                faster = f"it ran {rate / rates[chosen]:.2f}x the chosen configuration in the search; "
            elif rate and baseline_samples_per_s:
                faster = f"it ran {rate / baseline_samples_per_s:.2f}x the baseline in the search; "
            inconclusive.setdefault(label(v.config), f"{v.config.short()}: {faster}{failed['quality'].reason}")
        elif set(failed) & {"numerics", "quality"}:  # the knob's own fault, not speed or script
            rejected.setdefault(label(v.config), "; ".join(
                f"{name}: {c.detail.get('reason', 'failed')}" for name, c in failed.items()))
    opt_out = None
    if exact:
        opt_out = "--exact was given: fp32 and no pruning throughout"
    elif not chosen.exact:
        opt_out = "run with --exact (or --fix precision=fp32) to keep everything in fp32"
    return PrecisionNote(
        chosen=chosen.precision,
        checked=describe_checks(winner, scored_by=scored_by) if winner is not None else None,
        rejected=rejected, inconclusive=inconclusive, judged=judged,
        instead=(f"the fastest verified configuration ({label(chosen)})" if winner is not None
                 else "the baseline"),
        opt_out=opt_out,
        skipped={k: r for k, r in space.excluded.items() if k.startswith(("precision", "prune"))})
