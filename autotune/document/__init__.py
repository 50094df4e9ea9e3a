"""What a run measured and decided, as typed values: ``RunDocument`` is ``best_config.json``.

Each stage builds its own part (the verification its checks, the standalone pairs and the
ablation, the precision note; ``emit.assemble`` the baseline and the document itself), and
the document is serialized once, by ``RunDocument.to_json``. The JSON key names live
here and nowhere else; ``autotune/schemas/best_config.schema.json`` pins the same shape.

An unverified run has no speedup (``"speedup": null``): nothing was measured against the
baseline, and a ratio of 1.0 over no pairs would read like a measurement.

measures.py holds the measured parts, ablation.py the ablation's, plan.py the planned
run's (``--train-steps``, ``--epochs``), run.py the document itself, paths.py where a
written one's files are. The stages import these types; this folder imports no stage.
"""
