"""Stage 3, search: Optuna over the space (tuner), on a study kept in the output folder (study)."""
