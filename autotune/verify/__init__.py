"""Stage 4, verify: the gates (numerics, quality), side-by-side speed, the ablation, the
standalone pairs, and re-verifying an output folder later."""
