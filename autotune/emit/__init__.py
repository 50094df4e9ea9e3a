"""Stage 5, emit: best_config.json, train_tuned.py with its runtime, launch.sh and the
same configuration for the user's own launcher."""
