"""The recorded run the report and advice tests read: a real best_config.json (fashion_cnn
on a 2-core AVX-512 BF16 machine), its ablation as the pipeline records it, and a study of
the trials such a run stores."""
from __future__ import annotations

import json
from pathlib import Path

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState, create_trial

from autotune.document.ablation import Ablation
from autotune.document.run import RunDocument
from autotune.search.study import study_name

FIXTURE = Path(__file__).parent / "fixtures" / "report" / "best_config.json"

# The ablation as the pipeline records it (autotune.verify.ablation.measure), for the winner of
# the fixture run.
ABLATION = Ablation.from_json({
    "knobs": [
        {"knob": "layout", "baseline": "1xdefault", "winner": "2x1", "ratio": 1.12, "ci_low": 1.05,
         "ci_high": 1.2, "ci_level": 0.9, "kept": True, "note": ""},
        {"knob": "batch_size", "baseline": 64, "winner": 512, "ratio": 1.41, "ci_low": 1.33,
         "ci_high": 1.48, "ci_level": 0.9, "kept": True, "note": ""},
        {"knob": "interop_threads", "baseline": None, "winner": 1, "ratio": 1.08, "ci_low": 1.02,
         "ci_high": 1.15, "ci_level": 0.9, "kept": True, "note": ""},
        {"knob": "precision", "baseline": "fp32", "winner": "bf16", "ratio": 1.7, "ci_low": 1.55,
         "ci_high": 1.86, "ci_level": 0.9, "kept": True, "note": ""},
        {"knob": "channels_last", "baseline": False, "winner": True, "ratio": 1.01, "ci_low": 0.97,
         "ci_high": 1.06, "ci_level": 0.9, "kept": False,
         "note": "no measurable effect: removed from the emitted configuration"},
        {"knob": "allocator", "baseline": "default", "winner": "tcmalloc", "kept": True,
         "note": "could not be measured without it: crash"},
    ],
    "rounds": 8,
    "product": 2.6,
    "path": {
        "steps": [
            {"knobs": [k], "baseline": [b], "winner": [w], "ratio": r, "ci_low": r - 0.05, "ci_high": r + 0.06,
             "ci_level": 0.95, "rounds": 8, "kept": k != "channels_last"}
            for k, b, w, r in (("layout", "1xdefault", "2x1", 1.12), ("batch_size", 64, 512, 1.3),
                               ("interop_threads", None, 1, 1.05), ("precision", "fp32", "bf16", 1.6),
                               ("channels_last", False, True, 0.99), ("allocator", "default", "tcmalloc", 1.02))],
        "total": 2.42, "ci_low": 2.3, "ci_high": 2.55, "ci_level": 0.95, "rounds": 8,
        "kept_product": 2.45,
    },
})


def load_doc() -> RunDocument:
    """A real result document (fashion_cnn on a 2-core AVX-512 BF16 machine)."""
    return RunDocument.from_json(json.loads(FIXTURE.read_text()))


def _config(doc: RunDocument, **changes) -> dict:
    """The baseline's configuration with ``changes`` (layout="1x2" sets ranks and threads),
    as the study stores it."""
    cfg = doc.baseline.config.to_dict()
    if "layout" in changes:
        ranks, threads = changes.pop("layout").split("x")
        cfg.update(nprocs=int(ranks), threads=int(threads))
    cfg.update(changes, persistent_workers=changes.get("num_workers", cfg["num_workers"]) > 0)
    return cfg


# number: (state, samples/s, role, changes from the baseline, extra user attrs)
TRIALS = [
    (TrialState.COMPLETE, 4388.0, "baseline", {}, {}),
    (TrialState.COMPLETE, 4728.0, "heuristic", {"layout": "1x2", "allocator": "tcmalloc", "affinity": "compact"}, {}),
    (TrialState.COMPLETE, 5583.0, "precision", {"layout": "1x2", "precision": "bf16", "allocator": "tcmalloc"}, {}),
    (TrialState.COMPLETE, 11601.0, None, {"layout": "1x2", "batch_size": 512, "num_workers": 1, "interop_threads": 1,
                                          "precision": "bf16", "channels_last": True, "allocator": "tcmalloc"}, {}),
    (TrialState.COMPLETE, 11464.0, "batch", {"layout": "1x2", "batch_size": 256, "num_workers": 1,
                                             "interop_threads": 1, "precision": "bf16", "channels_last": True}, {}),
    (TrialState.PRUNED, 2422.0, "batch", {"layout": "1x2", "batch_size": 128}, {}),
    (TrialState.FAIL, None, None, {"layout": "2x1", "batch_size": 512, "num_workers": 2},
     {"failure": "out_of_memory", "result": {"message": "RuntimeError: out of memory"}}),
    (TrialState.COMPLETE, 11601.0, None, {"layout": "1x2", "batch_size": 512, "num_workers": 1, "interop_threads": 1,
                                          "precision": "bf16", "channels_last": True, "allocator": "tcmalloc"},
     {"duplicate_of": 3}),
    (TrialState.PRUNED, 4582.0, "late", {"layout": "1x2", "batch_size": 512, "num_workers": 1, "interop_threads": 1,
                                         "compile": "default", "precision": "bf16", "channels_last": True,
                                         "allocator": "tcmalloc"}, {}),
]


def build_study(folder: Path, doc: RunDocument, trials: list | None = None) -> optuna.Study:
    """A journal study in ``folder`` named as `autotune run` names it, holding ``trials``
    with the user attributes the tuner stores (config, role, result, failure)."""
    space = doc.included
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(folder / "study.journal")))
    study = optuna.create_study(storage=storage, direction="maximize",
                                study_name=study_name(Path(doc.model_file), doc.fingerprint["id"]))
    for state, value, role, changes, extra in TRIALS if trials is None else trials:
        cfg = _config(doc, **changes)
        params = {} if role == "baseline" else {
            k: (f"{cfg['nprocs']}x{cfg['threads']}" if k == "layout" else cfg[k])
            for k in space if len(space[k]) > 1 and (k != "compile" or role == "late")}
        attrs = {"config": cfg, **({"role": role} if role else {}), **extra}
        if state != TrialState.FAIL:
            attrs.setdefault("result", {"status": "ok", "value": value, "message": ""})
        study.add_trial(create_trial(
            state=state, value=value if state == TrialState.COMPLETE else None, params=params,
            distributions={k: CategoricalDistribution(space[k]) for k in params}, user_attrs=attrs,
            intermediate_values={0: value, 1: value} if value is not None else {}))
    return study
