"""How close configurations of one model run to the device's peak, each in a fresh process,
built by autotune's runtime exactly as a trial and train_tuned.py build them: samples/s,
achieved FLOP/s (the step's FLOPs counted once by torch.utils.flop_counter), the share of the
device's dense peak for its precision, and for the named ones where their step goes
(torch.profiler).

    python bench/gpu_mfu.py bench/workloads/gpt2_small.py --out OUT \\
        --config baseline: --config bf16c:precision=bf16,compile=default,batch_size=16 \\
        --config fused:precision=bf16,compile=default,batch_size=16,optimizer_step=fused \\
        --profile fused --seconds 4 --windows 3

A configuration is NAME:KNOB=VALUE,... over the model file's own batch size and autotune's
baseline (fp32, nothing turned); values are read as JSON where they parse (16, true),
else as strings. Configurations run one after another, each once (a compile is paid once
per process); each reports the median and range of its windows. OUT/mfu.json holds it all.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_config(text: str) -> tuple[str, dict[str, Any]]:
    name, _, knobs = text.partition(":")
    cfg: dict[str, Any] = {}
    for item in filter(None, knobs.split(",")):
        key, _, value = item.partition("=")
        try:
            cfg[key] = json.loads(value)
        except json.JSONDecodeError:
            cfg[key] = value
    return name, cfg


def child(model_file: str, name: str, knobs: dict[str, Any], *, seconds: float, windows: int,
          warmup: int, profile: bool, out: Path) -> dict[str, Any]:
    """One configuration in this process: build, warm up, time windows, optionally profile."""
    import torch

    from autotune.config import TrialConfig
    from autotune.runtime.session import Session, load_user_module

    user = load_user_module(model_file)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    base = {"batch_size": int(getattr(user, "batch_size", 32)), "device": device,
            "backend": "nccl" if device == "cuda" else "gloo"}
    cfg = TrialConfig.from_dict({**base, **knobs}).to_dict()
    t0 = time.perf_counter()
    session = Session(model_file, cfg)  # type: ignore[arg-type]
    build_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    session.run_steps(warmup)
    warmup_s = time.perf_counter() - t0
    # steps per window from one timed step after warm-up
    one, _ = session.run_steps(1)
    steps = max(2, int(seconds / max(one, 1e-4)))
    rates = []
    for _ in range(windows):
        elapsed, _ = session.run_steps(steps)
        rates.append(steps * session.global_batch / elapsed)
    result: dict[str, Any] = {
        "name": name, "config": TrialConfig.from_dict(cfg).short(), "build_s": round(build_s, 1),
        "warmup_s": round(warmup_s, 1), "steps_per_window": steps, "samples_per_s": rates,
        "median_samples_per_s": statistics.median(rates),
        "peak_memory_gib": (torch.cuda.max_memory_allocated() / 2**30) if device == "cuda" else None,
    }
    if profile:
        result["profile"] = profile_steps(session, steps=max(3, min(steps, 10)), out=out / f"profile-{name}.txt")
    return result


def profile_steps(session: Any, *, steps: int, out: Path) -> dict[str, Any]:
    """Where the step goes over ``steps`` steps, as train_tuned.py --profile divides it
    (autotune.runtime.shares); the profiler's own table of ops and kernels to ``out``."""
    import torch

    from autotune.runtime.profile import events_of, window
    from autotune.runtime.shares import step_shares

    prof, seconds = window(session, steps, profiled=True)
    cuda = torch.cuda.is_available()
    out.write_text(prof.key_averages().table(sort_by="device_time_total" if cuda else "self_cpu_time_total",
                                             row_limit=30))
    return step_shares(events_of(prof)).to_json(device="cuda" if cuda else "cpu",
                                                measured_step_ms=1e3 * seconds / steps)


def count_flops(model_file: str) -> dict[str, Any]:
    """FLOPs of one sample's forward and backward (autotune's own count, runtime.flops), on
    the plain model."""
    import torch

    from autotune.runtime.flops import count_flops as counted
    from autotune.runtime.model import user_loss
    from autotune.runtime.session import load_user_module

    user = load_user_module(model_file)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = user.build_model().to(device)
    batch = [torch.as_tensor(x).unsqueeze(0).to(device) for x in user.build_dataset()[0]]
    flops = counted(lambda: user_loss(user, model, batch, cfg={}, device=device))
    return {"flops_per_sample": flops,
            "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model_file")
    p.add_argument("--config", action="append", default=[], help="NAME:KNOB=VALUE,...")
    p.add_argument("--profile", action="append", default=[], help="a configuration's name to profile")
    p.add_argument("--seconds", type=float, default=4.0)
    p.add_argument("--windows", type=int, default=3)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--timeout", type=float, default=300, help="most seconds one configuration gets")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.child == "flops":
        print(json.dumps(count_flops(args.model_file)))
        return 0
    if args.child:
        name, knobs = parse_config(args.child)
        print(json.dumps(child(args.model_file, name, knobs, seconds=args.seconds, windows=args.windows,
                               warmup=args.warmup, profile=name in args.profile, out=args.out)))
        return 0

    def run(child_arg: str) -> dict[str, Any]:
        cmd = [sys.executable, __file__, args.model_file, "--child", child_arg, "--out", str(args.out),
               "--seconds", str(args.seconds), "--windows", str(args.windows), "--warmup", str(args.warmup),
               *sum((["--profile", n] for n in args.profile), [])]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                                  env={**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"})
        except subprocess.TimeoutExpired:
            return {"name": child_arg, "error": f"timed out after {args.timeout} s"}
        lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
        if done.returncode or not lines:
            return {"name": child_arg, "error": (done.stderr or done.stdout)[-2000:]}
        return json.loads(lines[-1])

    doc: dict[str, Any] = {"model_file": args.model_file, "flops": run("flops"), "configs": []}
    flops = doc["flops"].get("flops_per_sample")
    from autotune.probes.peaks import table_peak

    peak = table_peak(doc["flops"].get("device", ""), "bf16")
    print(json.dumps(doc["flops"]), flush=True)
    for text in args.config or ["baseline:"]:
        t0 = time.perf_counter()
        result = run(text)
        result["wall_s"] = round(time.perf_counter() - t0, 1)
        if flops and "median_samples_per_s" in result:
            achieved = flops * result["median_samples_per_s"]
            result["tflops"] = achieved / 1e12
            if peak is not None:
                result["mfu_bf16_dense"] = achieved / peak.flop_per_s
        doc["configs"].append(result)
        (args.out / "mfu.json").write_text(json.dumps(doc, indent=2))
        shown = {k: result.get(k) for k in ("name", "config", "median_samples_per_s", "tflops", "mfu_bf16_dense",
                                            "peak_memory_gib", "build_s", "warmup_s", "wall_s", "error")}
        print(json.dumps(shown), flush=True)
        if "profile" in result:
            print(json.dumps({"profile": result["profile"]}), flush=True)
    base = doc["configs"][0].get("median_samples_per_s")
    for result in doc["configs"][1:]:
        if base and result.get("median_samples_per_s"):
            print(f"{result['name']}: {result['median_samples_per_s'] / base:.2f}x the first", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
