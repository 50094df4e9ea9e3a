"""Running one trial in its own process tree, and telling how it ended (DESIGN §4).

The tuner stays idle while a trial measures: it only polls the trial's event file,
its wall time and its memory a few times a second.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from autotune import launch, proctree
from autotune.config import TrialConfig

# Failure kinds, as shown to the user and stored on the Optuna trial.
OUT_OF_MEMORY = "out_of_memory"
TIMEOUT = "timeout"
HANG = "hang"
CRASH = "crash"
FAILURE_HELP = {
    "out_of_memory": "ran out of memory",
    "timeout": "did not finish within the trial timeout",
    "hang": "stopped making progress (no step finished within the hang timeout)",
    "crash": "the trial process died",
    "compile_error": "torch.compile failed",
    "nan_loss": "the loss became NaN or infinite",
    "user_error": "the model file raised an error",
    "error": "the trial raised an error",
}


@dataclasses.dataclass(frozen=True)
class Measurement:
    """How long a trial measures: warm-up steps, then windows of about window_s."""

    warmup_steps: int = 3
    window_s: float = 1.0
    windows: int = 3

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class TrialResult:
    status: str  # "ok", "pruned" or "failed"
    value: float | None = None  # median window throughput, samples/s
    values: list[float] = dataclasses.field(default_factory=list)
    iqr: float | None = None
    failure: str | None = None
    message: str = ""
    log_tail: str = ""
    setup: dict[str, Any] = dataclasses.field(default_factory=dict)
    facts: dict[str, Any] = dataclasses.field(default_factory=dict)
    warmup: dict[str, Any] = dataclasses.field(default_factory=dict)
    done: dict[str, Any] = dataclasses.field(default_factory=dict)
    peak_tree_rss_mb: float = 0.0
    wall_s: float = 0.0
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    warnings: list[str] = dataclasses.field(default_factory=list)
    log_path: str = ""

    @property
    def one_time_s(self) -> float | None:
        """Setup plus the first step's excess over a steady step (where compile lands)."""
        if not self.setup or not self.warmup:
            return None
        excess = self.warmup["first_step_s"] - self.warmup["step_s"]
        return self.setup["seconds"] + max(0.0, excess)

    @property
    def losses(self) -> list[float]:
        return list(self.done.get("losses", []))

    def describe_failure(self) -> str:
        text = FAILURE_HELP.get(self.failure or "", self.failure or "failed")
        return f"{text}: {self.message}" if self.message else text

    def summary(self) -> dict[str, Any]:
        """What is stored on the study's trial: small, JSON-able."""
        return {
            "status": self.status,
            "value": self.value,
            "values": self.values,
            "iqr": self.iqr,
            "failure": self.failure,
            "message": self.message[:1000],
            "log_tail": self.log_tail[-3000:],
            "one_time_s": self.one_time_s,
            "peak_rss_mb": round(self.peak_tree_rss_mb, 1),
            "wall_s": round(self.wall_s, 2),
            "losses": self.losses[:200],
            "facts": {k: v for k, v in self.facts.items() if k != "layer_widths"},
            "threads_seen": self.setup.get("threads"),
            "world": self.setup.get("world"),
        }


class _EventReader:
    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.buffer = path, 0, b""

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        self.buffer += chunk
        *lines, self.buffer = self.buffer.split(b"\n")
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out


def _tail(path: Path, lines: int = 30) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


_TORCHRUN_SIGNAL = re.compile(r"Signal (\d+) \((SIG\w+)\) received by PID|exitcode\s*:\s*-(\d+)")


def _signal_from_log(log: str) -> str | None:
    match = _TORCHRUN_SIGNAL.search(log)
    if not match:
        return None
    if match.group(2):
        return match.group(2)
    try:
        return signal.Signals(int(match.group(3))).name
    except ValueError:
        return f"signal {match.group(3)}"


class TrialRunner:
    """Runs configurations of one model file, each in a fresh process tree."""

    def __init__(
        self,
        *,
        model_file: str | os.PathLike[str],
        machine: Mapping[str, Any],
        workdir: str | os.PathLike[str],
        measurement: Measurement = Measurement(),
        timeout_s: float = 180.0,
        hang_s: float = 30.0,
        memory_limit_bytes: int | None = None,
        python: str = sys.executable,
        seed: int = 0,
    ) -> None:
        self.model_file = str(Path(model_file).resolve())
        self.machine = machine
        self.workdir = Path(workdir)
        self.measurement = measurement
        self.timeout_s = timeout_s
        self.hang_s = hang_s
        self.memory_limit_bytes = memory_limit_bytes
        self.python = python
        self.seed = seed

    def run(
        self,
        cfg: TrialConfig,
        *,
        name: str,
        on_window: Callable[[int, float], bool] | None = None,
        trajectory_steps: int | None = None,
        quality_steps: int | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> TrialResult:
        """Measure ``cfg``; or, with ``trajectory_steps``, record that many losses; or,
        with ``quality_steps``, train that many steps and score with ``evaluate``.
        ``on_window(i, samples_per_s)`` returning True prunes the trial."""
        folder = self.workdir / name
        folder.mkdir(parents=True, exist_ok=True)
        events_path, log_path, spec_path = (
            folder / "events.jsonl", folder / "log.txt", folder / "spec.json"
        )
        events_path.unlink(missing_ok=True)
        spec = {
            "model_file": self.model_file,
            "config": cfg.to_dict(),
            "events": str(events_path),
            "measure": self.measurement.to_dict(),
            "seed": self.seed,
        }
        if trajectory_steps is not None:
            spec.update(mode="trajectory", steps=trajectory_steps)
        elif quality_steps is not None:
            spec.update(mode="quality", steps=quality_steps)
        spec_path.write_text(json.dumps(spec, indent=1))

        result = TrialResult(status="failed", log_path=str(log_path))
        try:
            env_vars, result.warnings = launch.environment(cfg, machine=self.machine)
        except ValueError as exc:
            result.failure, result.message = "error", str(exc)
            return result
        result.env = env_vars
        env = {**os.environ, **env_vars, **(extra_env or {}), "PYTHONUNBUFFERED": "1"}
        # The worker runs from autotune's own source tree whether or not it is installed.
        package_root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        argv = launch.command(cfg, ["-m", "autotune.worker", str(spec_path)], python=self.python)

        started = time.monotonic()
        last_progress = None  # set once steps run: only then can a stall be called a hang
        killed_for: tuple[str, str] | None = None
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=str(folder), start_new_session=True,
            )
            reader = _EventReader(events_path)
            try:
                while True:
                    for ev in reader.read():
                        kind = ev.get("e")
                        if kind in ("beat", "window", "warmup", "facts"):
                            last_progress = time.monotonic()
                        if kind == "setup":
                            result.setup = ev
                        elif kind == "facts":
                            result.facts = ev
                        elif kind == "warmup":
                            result.warmup = ev
                        elif kind == "window":
                            result.values.append(float(ev["samples_per_s"]))
                            if killed_for is None and on_window and on_window(ev["i"], ev["samples_per_s"]):
                                killed_for = ("pruned", "")
                        elif kind == "done":
                            result.done = ev
                        elif kind == "error" and result.failure is None:
                            result.failure, result.message = ev["kind"], ev["message"]
                    if killed_for is not None or proc.poll() is not None:
                        break
                    now = time.monotonic()
                    if now - started > self.timeout_s:
                        killed_for = (TIMEOUT, f"still running after {self.timeout_s:.0f} s")
                    elif last_progress is not None and now - last_progress > self.hang_s:
                        killed_for = (HANG, f"no progress for {self.hang_s:.0f} s")
                    else:
                        rss = proctree.tree_rss(proc.pid)
                        result.peak_tree_rss_mb = max(result.peak_tree_rss_mb, rss / 2**20)
                        if self.memory_limit_bytes and rss > self.memory_limit_bytes:
                            killed_for = (
                                OUT_OF_MEMORY,
                                f"used {rss / 2**20:.0f} MiB, over the trial limit of "
                                f"{self.memory_limit_bytes / 2**20:.0f} MiB",
                            )
                    if killed_for is not None:
                        break
                    time.sleep(0.2)
            finally:
                proctree.kill_tree(proc.pid)
                proc.wait()
        result.wall_s = time.monotonic() - started
        for ev in reader.read():  # lines written just before the end
            if ev.get("e") == "done":
                result.done = ev
            elif ev.get("e") == "error" and result.failure is None:
                result.failure, result.message = ev["kind"], ev["message"]
        result.log_tail = _tail(log_path)

        if killed_for is not None:
            result.status = "pruned" if killed_for[0] == "pruned" else "failed"
            if result.status == "failed":
                result.failure, result.message = killed_for
        elif result.done and proc.returncode == 0:
            result.status = "ok"
            if "value" in result.done:
                result.value = float(result.done["value"])
                result.iqr = result.done.get("iqr")
                result.values = list(result.done.get("values", result.values))
        elif result.failure is None:
            result.failure = CRASH
            sig = -proc.returncode if proc.returncode < 0 else None
            name_ = signal.Signals(sig).name if sig else _signal_from_log(result.log_tail)
            result.message = f"killed by {name_}" if name_ else f"exit code {proc.returncode}"
        return result
