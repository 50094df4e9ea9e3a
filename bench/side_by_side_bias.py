"""Does the side-by-side measurement of verification part from what a user measures
running the emitted script alone, and by how much? Takes a finished run's output folder
and, round after round, measures its baseline (B) and emitted configuration (C) both ways
within seconds of each other, so that the machine's drift over minutes cancels out:

  script   the launch.sh of each, run alone for about --seconds of timed training
  served   B and C held alive (as verification holds them) and measured one window each

Each round runs B-script, C-script, B-window, C-window (the order rotates). Printed: the
median over rounds of served/script for B and for C, and of the side-by-side speedup over
the standalone one, with distribution-free intervals; and the CPU time stolen from this
VM by its host during each kind of measurement (a shared machine's drift shows there).

    python bench/side_by_side_bias.py /tmp/out/fashion_cnn --rounds 8
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.document import paths
from autotune.document.run import RunDocument
from autotune.emit import outputs as emit
from autotune.probes import probe_machine
from autotune.trials import launch
from autotune.trials.runner import Measurement, TrialRunner, run_launcher
from autotune.trials.spec import TrialMode
from autotune.verify import stats


def steal_ticks() -> int:
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return int(fields[8]) if len(fields) > 8 else 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", type=Path)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--seconds", type=float, default=4.0, help="timed seconds of a script run")
    p.add_argument("--window", type=float, default=1.0, help="seconds of a served window")
    args = p.parse_args()
    doc = RunDocument.from_json(json.loads((args.out / "best_config.json").read_text()))
    machine = probe_machine()
    cfgs = {"B": doc.baseline.config, "C": doc.config}
    model = paths.model_file(doc, args.out)
    work = Path(tempfile.mkdtemp(prefix="bias-"))
    runner = TrialRunner(model_file=model, machine=machine, workdir=work / "trials",
                         measurement=Measurement(window_s=args.window))
    launchers, served = {}, {}
    for name, cfg in cfgs.items():
        env, _ = launch.environment(cfg, machine=machine)
        written = emit.write_candidate(work / name, cfg=cfg, model_file=model, env=env, description=name)
        launchers[name] = paths.resolve(written, work / name, "launcher")
    rates = {"B": doc.baseline.samples_per_s, "C": (doc.best or doc.baseline).samples_per_s}
    values: dict[str, list[float]] = {f"{k}-{n}": [] for k in ("script", "served") for n in cfgs}
    steal = {"script": [0, 0.0], "served": [0, 0.0]}  # ticks, seconds
    try:
        for name, cfg in cfgs.items():
            served[name] = runner.start(cfg, name=f"served-{name}", mode=TrialMode.serve())
            if not served[name].wait_ready():
                raise SystemExit(f"{name} failed: {served[name].result.describe_failure()}")
        jobs = [("script", "B"), ("script", "C"), ("served", "B"), ("served", "C")]
        for r in range(args.rounds):
            for kind, name in jobs[r % 4:] + jobs[: r % 4]:
                t0, s0 = time.monotonic(), steal_ticks()
                if kind == "script":
                    steps = 3 + int(args.seconds * rates[name] / cfgs[name].batch_size)
                    report = run_launcher(launchers[name], steps=steps, workdir=work / f"{name}-{r}",
                                          timeout_s=600)
                    if report.samples_per_s is None:
                        raise SystemExit(f"{name}: the run timed no step (stopped by signal {report.stopped_by})")
                    value = report.samples_per_s
                else:
                    served_value = served[name].window()
                    if served_value is None:
                        raise SystemExit(f"{name}: its served process died: {served[name].result.describe_failure()}")
                    value = served_value
                steal[kind][0] += steal_ticks() - s0
                steal[kind][1] += time.monotonic() - t0
                values[f"{kind}-{name}"].append(value)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in values.items()),
                  flush=True)
    finally:
        for trial in served.values():
            trial.kill()

    def summary(ratios: list[float]) -> dict[str, float]:
        interval = stats.ratio_interval(ratios, confidence=0.9)
        return {k: round(float(v), 3) for k, v in interval.to_json().items() if isinstance(v, (int, float))}

    hz = 100  # USER_HZ: /proc/stat counts in hundredths of a second on Linux
    result = {
        "configs": {n: c.short() for n, c in cfgs.items()},
        "medians": {k: statistics.median(v) for k, v in values.items()},
        "served_over_script_B": summary([a / b for a, b in zip(values["served-B"], values["script-B"])]),
        "served_over_script_C": summary([a / b for a, b in zip(values["served-C"], values["script-C"])]),
        "speedup_served": summary([c / b for c, b in zip(values["served-C"], values["served-B"])]),
        "speedup_script": summary([c / b for c, b in zip(values["script-C"], values["script-B"])]),
        "bias": summary([(sc / sb) / (pc / pb) for sc, sb, pc, pb in zip(
            values["served-C"], values["served-B"], values["script-C"], values["script-B"])]),
        "stolen_cpu_seconds_per_second": {k: round(t / hz / s, 4) if s else None for k, (t, s) in steal.items()},
        "values": values,
    }
    text = json.dumps(result, indent=1)
    print(text)
    (args.out / "bias.json").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
