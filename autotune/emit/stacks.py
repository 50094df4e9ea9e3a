"""The tuned configuration for the user's own stack, written beside best_config.json:
an Accelerate config file, the Lightning ``Trainer`` arguments, a torchrun script, the
lines to change in a hand-written training loop, and a Slurm batch script for several
nodes (emit.slurm).

Each tool expresses only some knobs; what one cannot (channels_last, interop threads,
TF32, cuDNN's benchmark mode outside Lightning, the DataLoader's arguments under
Accelerate, structured pruning, core pinning, activation checkpointing without
sharding, Accelerate's sharding on CPU) is named in that file and covered by the loop
snippet, never dropped silently. The memory knobs name the model's repeated block classes
(``Task.blocks``): what is checkpointed and what each shards on its own. The process
environment (threads, the allocator's preload) goes with each, since no tool sets it.

Each file has its renderer (emit.accelerate_config, emit.lightning_trainer,
emit.torchrun_script, emit.loop_snippet); what they share is in emit.stack_knobs.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from autotune.config import TrialConfig
from autotune.emit import slurm
from autotune.emit.accelerate_config import ACCELERATE_NAME, render_accelerate
from autotune.emit.lightning_trainer import LIGHTNING_NAME, lightning_arguments
from autotune.emit.loop_snippet import SNIPPET_NAME, render_snippet
from autotune.emit.torchrun_script import TORCHRUN_NAME, render_torchrun
from autotune.outdir import write_atomically

__all__ = ["ACCELERATE_NAME", "LIGHTNING_NAME", "SNIPPET_NAME", "TORCHRUN_NAME", "lightning_arguments",
           "render_accelerate", "render_snippet", "render_torchrun", "write_stack_files"]


def write_stack_files(out_dir: Path, *, cfg: TrialConfig, baseline: TrialConfig,
                      env: Mapping[str, str], default_threads: int | None = None,
                      blocks: tuple[str, ...] = ()) -> dict[str, str]:
    """Write the stack files (and sbatch.sh, see emit.slurm) into ``out_dir``; returns their
    names (relative to it).

    A configuration that leaves the threads to PyTorch ran with ``default_threads``, the
    count PyTorch chose on this machine; the files name it, because the other launchers
    choose their own where none is given (accelerate launch all physical cores, whatever
    the affinity mask; torchrun one per rank). ``blocks``: the model's repeated block classes
    (``Task.blocks``), which the memory knobs' settings name."""
    if default_threads:
        cfg, baseline = (c if c.threads else c.replace(threads=default_threads) for c in (cfg, baseline))
        env = {"OMP_NUM_THREADS": str(default_threads), **env}
    write_atomically(out_dir / ACCELERATE_NAME, render_accelerate(cfg, baseline, env, blocks=blocks))
    write_atomically(out_dir / LIGHTNING_NAME,
                     json.dumps(lightning_arguments(cfg, baseline, env, blocks=blocks), indent=2) + "\n")
    write_atomically(out_dir / TORCHRUN_NAME, render_torchrun(cfg, env), mode=0o755)
    write_atomically(out_dir / SNIPPET_NAME, render_snippet(cfg, baseline, env, blocks=blocks))
    write_atomically(out_dir / slurm.SBATCH_NAME, slurm.render_sbatch(cfg, env), mode=0o755)
    return {"accelerate": ACCELERATE_NAME, "lightning": LIGHTNING_NAME, "torchrun": TORCHRUN_NAME,
            "snippet": SNIPPET_NAME, "slurm": slurm.SBATCH_NAME}
