"""A simulated GPU node: a stand-in trial runner that models what the CUDA paths meet on
a real node, so the whole `autotune run` pipeline can be driven on recorded probes of
1x H100, 8x H100, a MIG slice and an exclusive-compute node on a machine without a GPU.

What it models, read from the machine document alone (never through autotune's own
reading of it, so a wrong reading shows up as a wrong run):
- the devices CUDA enumerates (``torch.cuda_devices``; under MIG one slice per process),
  each with its memory and its compute mode (from the NVML entry of the same PCI bus id);
- processes per device: a process of N ranks holds devices 0..N-1, one rank each, from
  its start until it ends; a rank beyond the devices fails as CUDA does ("invalid device
  ordinal");
- device memory: each rank holds a CUDA context plus the model's fixed memory (weights,
  gradients, optimizer state; its share of them under sharding) plus activations per
  sample of its micro-batch, halved under autocast, a quarter of them with activation
  checkpointing; a process that does not fit beside the ones already resident runs out
  of memory;
- compute modes: under EXCLUSIVE_PROCESS a second process on a device fails to create its
  context ("all CUDA-capable devices are busy or unavailable").

- time (``clock``, simulated seconds, ``SimCosts``): a process's start (interpreter,
  imports, data set, CUDA context, DataLoader workers), its warm-up, a compile (cold the
  first time a configuration compiles on the node, from the on-disk cache after: Dynamo's
  trace and the CUDA-graph capture remain), windows, trainings and script runs. A search
  trial reuses the idle process of the one before where the runner would
  (``runner.process_key``). A served process sets up in the background from its start and
  warms up, on its GPUs, when ``wait_ready`` asks (as ``LiveTrial.wait_ready`` does);
- what runs on each GPU and when: ``overlaps`` lists every window measured while another
  process ran on one of its GPUs; ``compiles`` every compile, by trial name.

Throughput grows with the per-GPU batch and the number of GPUs, reduced precision is
faster on Ampere or later (``SimModel``); losses and evaluate() as every stand-in's
(``doubles.StandIn``). A subclass may answer otherwise: ``landscape.LandscapeNode`` answers
throughput, memory and compile costs from a GPU landscape (tests/landscape.py) instead.
"""
from __future__ import annotations

import dataclasses
import json
import math
from collections import defaultdict
from pathlib import Path
from typing import Any

from autotune.config import TrialConfig
from autotune.trials.events import SetupEvent
from autotune.trials.runner import TrialResult, process_key
from autotune.trials.script_report import ScriptReport

from doubles import StandIn

GiB = 2**30
CONTEXT_BYTES = GiB // 2


@dataclasses.dataclass(frozen=True)
class SimModel:
    """A model as device memory sees it."""

    fixed_bytes: int = 40 * GiB  # weights, gradients, Adam's two moments
    sample_bytes: int = 2 * GiB  # fp32 activations per sample; autocast halves them
    rate: float = 1000.0  # samples/s of one GPU at a micro-batch of one, in fp32
    saturation: int = 2**30  # the micro-batch past which a GPU runs no faster


@dataclasses.dataclass(frozen=True)
class SimCosts:
    """Seconds, as a one-GPU H100 node paid them for the README example (a small CNN) in
    autotune's first GPU run: about 16 s a fresh visit, for about 4 s of measuring; 20 to
    100 s a cold compile."""

    start_s: float = 8.0  # interpreter, imports, build_dataset, CUDA context, workers
    warmup_s: float = 2.0  # warm-up steps, lead-in
    compile_s: float = 40.0  # a cold compile (reduce-overhead, default)
    autotune_s: float = 100.0  # a cold max-autotune compile
    recompile_s: float = 6.0  # from the on-disk cache: Dynamo's trace and the graphs' capture
    window_s: float = 1.0
    evaluate_s: float = 1.0


@dataclasses.dataclass
class Device:
    ordinal: int
    memory_bytes: int
    exclusive: bool
    resident: list[int] = dataclasses.field(default_factory=list)  # process ids
    used: dict[int, int] = dataclasses.field(default_factory=dict)  # process id -> bytes


def devices_of(doc: dict[str, Any]) -> list[Device]:
    """What CUDA enumerates on this node, with each device's memory and compute mode."""
    nvml = {g.get("pci_bus_id"): g for g in doc.get("gpus", [])}
    out = []
    for i, dev in enumerate(doc["torch"]["cuda_devices"]):
        parent = nvml.get(dev.get("pci_bus_id"), {})
        mode = dev.get("compute_mode") or parent.get("compute_mode") or "default"
        out.append(Device(i, int(dev["memory_bytes"]), mode == "exclusive_process"))
    return out


class _Process:
    """A live (served) configuration, a ``LiveTrialLike``: holds its devices until killed."""

    def __init__(self, node: SimulatedGpuNode, pid: int | None, cfg: TrialConfig,
                 failure: TrialResult | None, name: str) -> None:
        self.node, self.pid, self.cfg, self.name = node, pid, cfg, name
        self.result = failure or TrialResult(status="ok")
        self.rounds = 0

        self.set_up_at = node.clock + node.costs.start_s
        self.warm = False

    def wait_ready(self) -> bool:
        if self.pid is None:
            return False
        if not self.warm:
            self.node.clock = max(self.node.clock, self.set_up_at)
            self.node.busy(self.pid, self.cfg, self.node.warm_up_s(self.cfg, self.name))
            self.warm = True
        return True

    def window(self) -> float | None:
        if self.pid is None:
            return None
        assert self.warm, "measured before it was warmed up"
        self.rounds += 1
        self.node.busy(self.pid, self.cfg, self.node.costs.window_s, measuring=True)
        return self.node.throughput(self.cfg) * (1 + 0.01 * (self.rounds % 3))

    def kill(self) -> None:
        if self.pid is not None:
            self.node.release(self.pid)
            self.pid = None

    def memory(self) -> int:
        return GiB  # host memory: not what binds on a GPU node


class _Script:
    """A run of a script, a ``ScriptRunLike``: set up ``SimCosts.start_s`` after its start,
    it warms up and trains when let go."""

    def __init__(self, node: SimulatedGpuNode, pid: int | None, cfg: TrialConfig,
                 failure: TrialResult | None, name: str, steps: int) -> None:
        self.node, self.pid, self.cfg, self.failure, self.name = node, pid, cfg, failure, name
        self.steps = steps
        self.set_up_at = node.clock + node.costs.start_s

    def finish(self) -> ScriptReport:
        node = self.node
        if self.failure is not None or self.pid is None:
            raise RuntimeError(f"launch.sh failed: {self.failure.message if self.failure else 'cancelled'}")
        node.clock = max(node.clock, self.set_up_at)
        node.busy(self.pid, self.cfg, node.warm_up_s(self.cfg, self.name))
        node.busy(self.pid, self.cfg, self.steps * node.step_s(self.cfg), measuring=True)
        self.cancel()
        return ScriptReport(samples_per_s=node.throughput(self.cfg))

    def cancel(self) -> None:
        if self.pid is not None:
            self.node.release(self.pid)
            self.pid = None


class SimulatedGpuNode(StandIn):
    """A ``TrialRunnerLike`` (``run``, ``start``, ``run_script``) for a GPU node's machine
    document."""

    def __init__(self, doc: dict[str, Any], model: SimModel = SimModel(), *,
                 diverge: bool = False, costs: SimCosts = SimCosts()) -> None:
        super().__init__()
        self.doc, self.model, self.diverge, self.costs = doc, model, diverge, costs
        self.clock = 0.0
        self.activity: list[tuple[float, float, int, tuple[int, ...], bool]] = []  # start, end, pid, GPUs, window
        self.overlaps: list[str] = []
        self.compiles: list[tuple[str, TrialConfig]] = []
        self.cached: set[tuple[Any, ...]] = set()  # graphs compiled on this node: on disk since
        self.idle_key: str | None = None  # the search's idle warm process
        self.timeline: list[tuple[str, float]] = []  # (process name, clock at its start)
        self.devices = devices_of(doc)
        self.next_pid = 1
        self.max_per_device = 0  # most processes ever resident on one device at once
        self.failures: list[tuple[str, str]] = []  # (stage name, what happened)
        self.scripts: list[Path] = []
        self.ran: list[tuple[str, TrialConfig]] = []  # every process started, by stage name
        self.once: dict[TrialConfig, float] = {}  # each configuration's last one-time cost (its compile)

    # --- what a configuration needs and gets ---------------------------------------

    def rank_bytes(self, cfg: TrialConfig) -> int:
        share = 0.5 if cfg.precision in ("bf16", "fp16") else 1.0
        share *= 0.25 if cfg.activation_checkpointing else 1.0
        fixed = self.model.fixed_bytes // (cfg.nprocs if cfg.sharding != "off" else 1)
        return CONTEXT_BYTES + fixed + int(self.model.sample_bytes * share * cfg.micro_batch)

    def fraction_of_device(self, cfg: TrialConfig) -> float:
        return self.rank_bytes(cfg) / min(d.memory_bytes for d in self.devices)

    def throughput(self, cfg: TrialConfig) -> float:
        fast = {"bf16": 2.0, "fp16": 1.9, "tf32": 1.4}.get(cfg.precision, 1.0)
        per_gpu = self.model.rate * fast * (1 + 0.15 * math.log2(min(cfg.micro_batch, self.model.saturation)))
        per_gpu *= 0.75 if cfg.activation_checkpointing else 1.0  # a second forward per block
        per_gpu *= {"full": 0.93, "grad-op": 0.96}.get(cfg.sharding, 1.0)  # the gathers
        value = per_gpu * cfg.nprocs * 0.95 ** (cfg.nprocs - 1)
        value *= 1.1 if cfg.num_workers else 1.0
        value *= 1.03 if cfg.pin_memory else 1.0
        return value * (1.05 if cfg.compile != "off" else 1.0)

    def measured_done(self, cfg: TrialConfig) -> dict[str, Any]:
        return {"cuda_peak_mb": self.rank_bytes(cfg) / 2**20, "rank_peak_mb": self.rank_bytes(cfg) / 2**20,
                "cuda_total_mb": self.devices[0].memory_bytes / 2**20}

    def one_time_s(self, cfg: TrialConfig) -> float:
        """What a trial's first step paid once: its compile, cold or from the node's cache."""
        return self.once.get(cfg, 0.0)

    def step_s(self, cfg: TrialConfig) -> float:
        return cfg.batch_size / self.throughput(cfg)

    def warm_up_s(self, cfg: TrialConfig, name: str) -> float:
        """A process's warm-up: its steps, and the compile where ``cfg`` compiles."""
        if cfg.compile == "off":
            return self.costs.warmup_s
        self.compiles.append((name, cfg))
        # what the compiled graph depends on: a process knob (workers, threads) changes none
        graph = (cfg.micro_batch, cfg.precision, cfg.channels_last, cfg.compile, cfg.prune_ratio,
                 cfg.activation_checkpointing)
        if graph in self.cached:
            return self.costs.warmup_s + self.cached_compile_s(cfg)
        self.cached.add(graph)
        return self.costs.warmup_s + self.cold_compile_s(cfg)

    def cold_compile_s(self, cfg: TrialConfig) -> float:
        """A first compile of ``cfg`` on this node (a landscape's node: as recorded)."""
        return self.costs.autotune_s if cfg.compile.startswith("max-autotune") else self.costs.compile_s

    def cached_compile_s(self, cfg: TrialConfig) -> float:
        """A compile of ``cfg`` from the node's on-disk cache."""
        return self.costs.recompile_s

    def busy(self, pid: int, cfg: TrialConfig, seconds: float, *, measuring: bool = False) -> None:
        """``pid`` runs on its GPUs for ``seconds`` from now; a window measured while
        another process runs on one of them is recorded in ``overlaps``."""
        start, end = self.clock, self.clock + seconds
        gpus = tuple(range(cfg.nprocs))
        for a, b, other, theirs, window in self.activity:
            if other != pid and a < end and start < b and set(gpus) & set(theirs) and (measuring or window):
                self.overlaps.append(f"process {pid} ({cfg.short()}) beside process {other} at {start:.1f} s")
        self.activity.append((start, end, pid, gpus, measuring))
        self.clock = end

    # --- processes on devices ------------------------------------------------------

    def admit(self, cfg: TrialConfig, name: str) -> tuple[int | None, TrialResult | None]:
        """Start ``cfg``'s process: its ranks take devices 0..N-1. Returns its id, or the
        failure CUDA would give it."""
        self.ran.append((name, cfg))
        self.timeline.append((name, self.clock))
        if cfg.device != "cuda":
            return self._fail(name, "error", "this node's stand-in runs CUDA configurations only")
        if cfg.nprocs > len(self.devices):
            return self._fail(name, "error", f"CUDA error: invalid device ordinal (rank "
                                             f"{len(self.devices)} of {cfg.nprocs})")
        need = self.rank_bytes(cfg)
        for dev in self.devices[:cfg.nprocs]:
            if dev.exclusive and dev.resident:
                return self._fail(name, "error", "CUDA error: all CUDA-capable devices are busy "
                                                 "or unavailable")
            if sum(dev.used.values()) + need > dev.memory_bytes:
                return self._fail(name, "out_of_memory",
                                  f"CUDA out of memory on cuda:{dev.ordinal}: {need / GiB:.1f} GiB "
                                  f"wanted, {(dev.memory_bytes - sum(dev.used.values())) / GiB:.1f} "
                                  "GiB free")
        pid, self.next_pid = self.next_pid, self.next_pid + 1
        for dev in self.devices[:cfg.nprocs]:
            dev.resident.append(pid)
            dev.used[pid] = need
            self.max_per_device = max(self.max_per_device, len(dev.resident))
        return pid, None

    def release(self, pid: int) -> None:
        for dev in self.devices:
            if pid in dev.resident:
                dev.resident.remove(pid)
                del dev.used[pid]

    def _fail(self, name: str, failure: str, message: str) -> tuple[None, TrialResult]:
        self.failures.append((name, message))
        return None, TrialResult(status="failed", failure=failure, message=message)

    # --- the runner's interface -------------------------------------------------------

    def run(self, cfg: TrialConfig, *, name: str, on_window: Any = None,
            trajectory_steps: int | None = None, quality_steps: int | None = None,
            timeout_s: float | None = None, profile: bool = False, **kw: Any) -> TrialResult:
        self.limits.append((cfg, timeout_s))
        began = self.clock
        key = process_key(cfg)  # a gate's training takes a warm process as the runner's does
        warm = key is not None and key == self.idle_key
        if not warm:
            self.clock += self.costs.start_s
        self.idle_key = key
        pid, failure = self.admit(cfg, name)
        if failure is not None:
            self.idle_key = None
            return failure
        assert pid is not None
        try:
            warm_up = self.warm_up_s(cfg, name)
            self.once[cfg] = max(0.0, warm_up - self.costs.warmup_s)  # a compile, as a trial reports it
            self.busy(pid, cfg, warm_up)
            steps = trajectory_steps or quality_steps
            if steps is not None:
                self.busy(pid, cfg, steps * self.step_s(cfg) + (self.costs.evaluate_s * (1 + len(kw.get("evaluate_at", ())))
                                                            if quality_steps else 0.0))
            elif profile:  # its warm-up to a steady second, then a second profiled
                self.busy(pid, cfg, 2 * self.costs.window_s, measuring=True)
            else:
                self.busy(pid, cfg, 3 * self.costs.window_s, measuring=True)
            result = self.result(cfg, on_window=on_window, trajectory_steps=trajectory_steps,
                                 quality_steps=quality_steps, profile=profile)
        finally:
            self.release(pid)
        # where its time went, as a real trial reports it: what --timeout's estimates read
        result.wall_s = self.clock - began
        measured = 0.0 if steps is not None or profile else 3 * self.costs.window_s
        result.phases = {"measure_s": measured, "overhead_s": result.wall_s - measured,
                         "start_import_s": 0.0 if warm else self.costs.start_s}
        result.setup = dataclasses.replace(result.setup or SetupEvent(seconds=0.0), warm=warm)
        return result

    def start(self, cfg: TrialConfig, *, name: str, mode: Any = None, **kw: Any) -> _Process:
        self.idle_key = None  # a served process ends the runner's idle one
        pid, failure = self.admit(cfg, name)
        return _Process(self, pid, cfg, failure, name)

    def run_script(self, launcher: str | Path, *, steps: int, workdir: Path,
                   timeout_s: float) -> ScriptReport:
        """The emitted launch.sh, alone: its configuration read back from what was
        written beside it."""
        return self.start_script(launcher, steps=steps, workdir=workdir, timeout_s=timeout_s).finish()

    def start_script(self, launcher: str | Path, *, steps: int, workdir: Path,
                     timeout_s: float) -> _Script:
        """The emitted launch.sh started now: it sets up (on the host, and with its
        context and weights on its GPUs) and trains once let go (``_Script.finish``)."""
        self.scripts.append(Path(launcher))
        written = json.loads((Path(launcher).parent / "best_config.json").read_text())
        cfg = TrialConfig.from_dict(written.get("candidate") or written["config"])
        self.idle_key = None
        name = f"script:{launcher}"
        pid, failure = self.admit(cfg, name)
        return _Script(self, pid, cfg, failure, name, steps)

    def resident_anywhere(self) -> dict[int, list[int]]:
        """Processes still holding a device (none once a stage has ended)."""
        held: dict[int, list[int]] = defaultdict(list)
        for dev in self.devices:
            held[dev.ordinal] += dev.resident
        return {k: v for k, v in held.items() if v}
