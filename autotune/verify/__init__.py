"""Stage 4, verify: the gates (numerics, quality), side-by-side speed, the ablation and the
standalone pairs (stage.py); what the search leaves it of --timeout (reserve.py)."""
