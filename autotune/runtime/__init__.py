"""The training runtime: apply a configuration's in-process knobs and train.

Shared by the trial worker (which measures) and the generated ``train_tuned.py`` (which
trains): ``autotune.emit.outputs`` copies these files, unchanged, beside the script as the
package ``tuned_runtime``, so the script runs the very code that was measured. Hence
every import in here is relative and nothing imports autotune; the configuration comes
as plain data (``knobs.ConfigDict``).

Nothing runs at import. Whoever starts a rank process calls ``ranks.bootstrap()`` first,
before torch is imported (it starts the ranks, or pins this rank's cores); this file
imports nothing, so ``ranks`` can be imported that early.

- ``ranks``: starting the ranks and pinning their cores (stdlib only)
- ``knobs``: the knobs' vocabularies and the settings train_tuned.json carries (stdlib only)
- ``distributed``: this process's place in the job
- ``data``: the DataLoader, sharded over ranks; batches
- ``memory``: the memory knobs: the repeated blocks, checkpointing, sharding, micro-batches
- ``model``: the model with its knobs applied, one optimizer step
- ``session``: everything one rank needs to train
- ``facts``: what the knobs did, read from the process and a step
- ``process_facts``: what the process knobs did, as data (stdlib only)
- ``loop``: train_tuned.py's training loop: checkpoints, metrics, stop requests
- ``main``: train_tuned.py's command line
"""
