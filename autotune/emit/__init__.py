"""Stage 5, emit: the run document assembled from the stages' results (assemble.py), then
best_config.json, train_tuned.py with its runtime, launch.sh and the same configuration for
the user's own launcher (write.py), and the emitted script's step profile."""
