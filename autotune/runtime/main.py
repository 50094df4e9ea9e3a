"""train_tuned.py's command line: train the model with the settings of train_tuned.json.

The script itself only starts the ranks (``ranks.bootstrap``) and calls ``main``; its
configuration is data, in the JSON file beside it (``knobs.ScriptSettings``).
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import torch

from . import profile
from .distributed import DIST_TIMEOUT_MIN, lost_peer, report_lost_peer
from .facts import machine_differences
from .knobs import ScriptSettings
from .loop import Checkpoints, Metrics, latest_checkpoint, read_checkpoint, restore, train
from .model import config_lr_factor, first_lr
from .session import Session


def default_model_file(settings: ScriptSettings, *, folder: str) -> str:
    """The model file without --model-file: $MODEL_FILE, else the settings' path relative
    to ``folder`` (the output folder moved together with the project), else where it was
    tuned."""
    if os.environ.get("MODEL_FILE"):
        return os.environ["MODEL_FILE"]
    relative = os.path.normpath(os.path.join(folder, settings.model_file))
    tuned = settings.model_file_tuned
    return relative if os.path.exists(relative) or not os.path.exists(tuned) else tuned


def parse_args(argv: list[str] | None, *, description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--epochs", type=int, default=None,
                        help="passes over the dataset (default 1, or as many as --max-steps needs)")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="stop after this many steps in all (with --epochs: whichever comes first)")
    parser.add_argument("--model-file", default=None,
                        help="the model file (default: $MODEL_FILE, else the tuned one)")
    parser.add_argument("--checkpoint-dir", default="checkpoints", help="where rank 0 saves checkpoints")
    parser.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                        help="save every N steps (default: at each epoch's end); also saved at the "
                             "last step and on SIGTERM/SIGINT")
    parser.add_argument("--keep-checkpoints", type=int, default=3, metavar="K",
                        help="keep the newest K checkpoints (0: all)")
    parser.add_argument("--no-checkpoint", action="store_true", help="save no checkpoints")
    parser.add_argument("--resume", nargs="?", const="latest", default=None, metavar="CHECKPOINT",
                        help="continue from a checkpoint (default: the newest in --checkpoint-dir): "
                             "model, optimizer, loss scaler, random states and the data position")
    parser.add_argument("--metrics", default=None, metavar="FILE",
                        help="JSON lines of loss, evaluate() and checkpoints (default: "
                             "CHECKPOINT_DIR/metrics.jsonl; none with --no-checkpoint)")
    parser.add_argument("--tensorboard", default=None, metavar="DIR",
                        help="also log scalars for TensorBoard (needs the tensorboard package)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=50, help="print the loss every N steps")
    parser.add_argument("--report", default=None, help="write a JSON summary (throughput, losses) here")
    parser.add_argument("--no-evaluate", action="store_true",
                        help="skip evaluate() at the end of each epoch")
    parser.add_argument("--profile", action="store_true",
                        help="instead of training: warm up, then profile about a second of steps with "
                             "torch.profiler (rank 0) and print where the step goes (into --report too)")
    parser.add_argument("--start-after", default=None, metavar="FILE",
                        help="set up (data set, model, devices), then wait until FILE exists before the "
                             "first step: a launcher can set up one run while another trains")
    parser.add_argument("--dist-timeout-min", type=float, default=DIST_TIMEOUT_MIN, metavar="MIN",
                        help="with several ranks: how long a rank waits for the others (while rank 0 "
                             "evaluates, say) before the job is ended (default %(default)g)")
    return parser.parse_args(argv)


def restarted_by_torchrun() -> bool:
    """Whether torchrun started this rank again after the job's ranks failed."""
    try:
        return int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0) > 0
    except ValueError:
        return False


def batch_note(batch: int, *, baseline_batch: int | None, nodes: int = 1, lr_scaling: str = "none",
               lr_factor: float = 1.0, lr: float | None = None) -> str | None:
    """What the batch of a step means for the learning rate: a tuned batch size unlike the
    user's, or on several nodes the global batch (``batch`` per node, tuned on one, times
    ``nodes``); None when it is the user's (or one node's and the user's is unknown).
    ``lr_factor``: what --scale-lr (``lr_scaling``) multiplied the learning rates by, ``lr``
    the first parameter group's after it."""
    total = batch * nodes
    what = (f"the global batch size {total} (the tuned {batch} per node x {nodes} nodes)" if nodes > 1
            else f"the tuned batch size {batch}")
    if lr_factor != 1.0:
        change = f": from {lr / lr_factor:g} to {lr:g} for the first parameter group" if lr is not None else ""
        against = f" is {total / baseline_batch:g}x your {baseline_batch}" if baseline_batch else ""
        return (f"note: {what}{against}, and the learning rate was scaled by {lr_factor:g} "
                f"(--scale-lr {lr_scaling}){change}. autotune checked the loss and evaluate() at the "
                "tuned batch for a short run only, so watch them in a long one.")
    if not baseline_batch:
        if nodes == 1:
            return None
        return (f"note: {what} is what each optimizer step averages over, and the learning rate is "
                "unchanged: autotune tuned one node. The linear scaling rule suggests scaling it with "
                "the batch (with a warm-up); watch the loss and evaluate().")
    if total == baseline_batch:
        return None
    factor = total / baseline_batch
    return (f"note: {what} is {factor:g}x your {baseline_batch}, and the "
            f"learning rate is unchanged. The linear scaling rule suggests multiplying it by "
            f"{factor:g} (with a warm-up); autotune checked the loss and evaluate() at the tuned "
            "batch for a short run only, so watch them in a long one.")


def wait_for(path: str, *, poll_s: float = 0.02) -> None:
    """Until ``path`` exists (``--start-after``)."""
    while not os.path.exists(path):
        time.sleep(poll_s)


def main(argv: list[str] | None = None, *, config_path: str) -> int:
    """Train as the command line ``argv`` says, with the settings in ``config_path``;
    returns the exit code."""
    settings = ScriptSettings.read(config_path)
    args = parse_args(argv, description=settings.description)
    model_file = args.model_file or default_model_file(
        settings, folder=os.path.dirname(os.path.abspath(config_path)))
    state, start = None, 0
    if args.resume is None and not args.no_checkpoint and restarted_by_torchrun() \
            and latest_checkpoint(args.checkpoint_dir) is not None:
        # torchrun restarted the ranks (--max-restarts) after a rank or a node failed: go on
        # from the newest checkpoint, as --resume would, not from step 0
        args.resume = "latest"
    if args.resume:
        path = latest_checkpoint(args.checkpoint_dir) if args.resume == "latest" else args.resume
        if path is None or not os.path.exists(path):
            print(f"error: --resume: no checkpoint {'in ' + args.checkpoint_dir if path is None else path}",
                  file=sys.stderr)
            return 2
        state = read_checkpoint(path)
        start = int(state["step"])
    session = Session(model_file, settings.config, seed=args.seed, start_step=start,
                      dist_timeout_min=args.dist_timeout_min)
    rank0 = session.dist.rank == 0
    if rank0:
        for line in machine_differences(settings.tuned_for):
            print(f"warning: this machine differs from the one this config was tuned on: {line}",
                  file=sys.stderr, flush=True)
        note = batch_note(int(settings.config["batch_size"]), baseline_batch=settings.baseline_batch,
                          nodes=session.dist.nodes, lr_scaling=str(settings.config.get("lr_scaling", "none")),
                          lr_factor=config_lr_factor(settings.config, nodes=session.dist.nodes),
                          lr=first_lr(session.optimizer))
        if note and not args.resume:
            print(note, file=sys.stderr, flush=True)
    if state is not None:
        for line in restore(session, state):
            if rank0:
                print(f"warning: {line}", file=sys.stderr, flush=True)
        if rank0:
            print(f"resumed from {path} at step {start}", flush=True)
    if args.start_after:
        wait_for(args.start_after)
    per_epoch = session.per_epoch
    if args.max_steps is not None:
        # --max-steps alone trains that many steps, over as many epochs as it takes.
        total = args.max_steps if args.epochs is None or not per_epoch else min(args.max_steps, per_epoch * args.epochs)
    elif per_epoch:
        total = per_epoch * (1 if args.epochs is None else args.epochs)
    else:
        print("error: the dataset has no length: give --max-steps", file=sys.stderr)
        return 2
    folder = None if args.no_checkpoint else args.checkpoint_dir
    metrics_path = args.metrics or (os.path.join(folder, "metrics.jsonl") if folder else None)
    try:
        if args.profile:
            code = profile.run(session, report=args.report)
        else:
            code = train(session, total=total, start=start, config=settings.config,
                         checkpoints=Checkpoints(folder, every=args.checkpoint_every, keep=args.keep_checkpoints),
                         metrics=Metrics(metrics_path, tensorboard=args.tensorboard, enabled=rank0),
                         log_every=args.log_every, report=args.report, evaluate_each_epoch=not args.no_evaluate)
        if session.dist.enabled:
            torch.distributed.barrier()  # no rank leaves while another still needs it
    except RuntimeError as e:  # gloo's and NCCL's errors (DistBackendError is one)
        if not session.dist.enabled or not lost_peer(e):
            raise
        report_lost_peer(session.dist.rank, e)
        # the process group cannot be torn down with a rank missing: leave without it
        logging.shutdown()
        sys.stdout.flush()
        os._exit(1)
    if session.dist.enabled:
        # Everything is written. gloo's threads can abort a rank at interpreter teardown
        # ("terminate called without an active exception"), which fails the whole job
        # after training has finished. Leave without the teardown.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    session.close()
    return code
