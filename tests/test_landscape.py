"""GPU landscapes (tests/landscape.py): the reader (nearest point, the out-of-memory rule, the best
point a user allows, a bad file refused by name), the recorder (bench/gpu_landscape.py, on this
machine's CPU), the replay (a simulated one-H100 node answering from each fixture), and the
search's policy against each fixture's known best (the whole `autotune run` pipeline, every
clock reading the node's simulated seconds)."""
from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune import pipeline
from autotune.config import TrialConfig
from autotune.report.console import Reporter
from autotune.task import load_task

from doubles import recorded_machine
from helpers import written_document
from landscape import OUT_OF_MEMORY, Landscape, LandscapeError, LandscapeNode, Point, landscapes, workers_bucket

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.xdist_group("landscapes")
CUDA = TrialConfig(batch_size=1, device="cuda", backend="nccl")


@pytest.fixture(autouse=True)
def _all_gpus_visible(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


def fixture(name: str) -> Landscape:
    return Landscape.load(next(p for p in landscapes() if name in p.name))


def cfg(batch: int, precision: str = "fp32", compile: str = "off", workers: int = 0, **knobs) -> TrialConfig:
    return CUDA.replace(batch_size=batch, precision=precision, compile=compile, num_workers=workers,
                        persistent_workers=workers > 0, **knobs)


def point(c: TrialConfig, rate: float | None, *, peak: float | None = 100.0, spread: float = 0.02,
          failure: str | None = None) -> dict:
    out: dict = {"config": c.to_dict(), "phase": "grid", "warm": True, "setup_s": 0.1}
    if failure:
        return {**out, "samples_per_s": None, "failure": failure, "message": "CUDA out of memory"}
    return {**out, "samples_per_s": rate, "spread": spread, "peak_mb": peak, "compile_s": None}


def small(tmp_path: Path, points: list[dict], *, memory_mb: float = 80_000.0, **header) -> Path:
    """A landscape file of ``points`` (the writer's own format: bench/gpu_landscape.py)."""
    sys.path.insert(0, str(ROOT / "bench"))
    from gpu_landscape import write_landscape

    doc = {"format": 1, "workload": "examples/fashion_cnn.py", "recorded": False, "source": "a test's",
           "device": "a GPU", "device_type": "cuda", "memory_mb": memory_mb, "user_batch": 64,
           "costs": {"setup_s": 8.0, "warmup_s": 2.0, "compile_s": {"default": 30.0}, "recompile_s": None},
           **header, "points": points}
    path = tmp_path / "small.json"
    write_landscape(path, doc)
    return path


# --- the reader -------------------------------------------------------------------------------------


def test_each_fixture_is_labelled_shaped_and_has_one_best_point():
    assert sorted(p.name for p in landscapes()) == ["fashion_cnn_shaped_h100.json", "tiny_gpt_shaped_h100.json"]
    for path in landscapes():
        found = Landscape.load(path)
        assert not found.recorded and "not measured" in found.header["source"], path
        assert "bench/gpu_landscape.py replaces it" in found.header["source"], path
        assert (ROOT / found.workload).is_file(), found.workload
        assert 60 <= len(found.points) <= 120, (path, len(found.points))
        configs = [p.config for p in found.points]
        assert len(set(configs)) == len(configs), "a configuration recorded twice"
        rates = sorted((p.samples_per_s or 0.0 for p in found.ran), reverse=True)
        assert rates[0] > 1.01 * rates[1], (path, rates[:3])
        user = found.nearest(cfg(found.user_batch))
        assert user.config == cfg(found.user_batch) and user.samples_per_s
        # every power of two from the user's batch to the largest, in each precision, uncompiled
        top = max(p.batch for p in found.ran)
        for batch in (found.user_batch * 2**k for k in range(int(top / found.user_batch).bit_length())):
            for precision in ("fp32", "tf32", "bf16"):
                assert any(p.batch == batch and p.precision == precision and p.config.compile.value == "off"
                           for p in found.ran), (path, batch, precision)


def test_the_shaped_fixtures_show_what_the_h200_runs_showed():
    fashion = fixture("fashion_cnn")
    rate = fashion.rate
    assert 10_000 <= rate(cfg(64)) <= 12_500
    assert rate(cfg(4096, "bf16", workers=16, pin_memory=True)) > 1.3 * rate(cfg(1024, "bf16", workers=16,
                                                                                      pin_memory=True))
    assert 1.2 <= rate(cfg(4096, "tf32", workers=16, pin_memory=True)) / rate(cfg(4096, workers=16,
                                                                                  pin_memory=True)) <= 1.4
    assert 1.4 <= rate(cfg(4096, "bf16", workers=16, pin_memory=True)) / rate(cfg(4096, workers=16,
                                                                                  pin_memory=True)) <= 1.6
    assert rate(cfg(64, "bf16")) / rate(cfg(64)) < 1.05
    for workers in (8, 16):
        gain = rate(cfg(256, "tf32", workers=workers, pin_memory=True)) / rate(cfg(256, "tf32", workers=4,
                                                                                  pin_memory=True))
        assert 1.08 <= gain <= 1.17, (workers, gain)
    assert fashion.nearest(cfg(256, "tf32", workers=4, pin_memory=True)).shares["data_wait"] == pytest.approx(0.13,
                                                                                                             abs=0.02)
    ro = rate(cfg(256, "bf16", "reduce-overhead", 16, pin_memory=True)) / rate(cfg(256, "bf16", workers=16,
                                                                                  pin_memory=True))
    assert 1.2 <= ro <= 1.3
    gpt = fixture("tiny_gpt")
    assert gpt.nearest(cfg(32, "tf32", workers=4, pin_memory=True)).shares["idle"] >= 0.8
    assert rate(cfg(512, workers=16, pin_memory=True)) > 0  # (fashion) sanity
    assert gpt.rate(cfg(512)) / gpt.rate(cfg(16)) > 0.8 * 32  # nearly proportional to the batch
    assert gpt.rate(cfg(16, "bf16", "reduce-overhead", 16, pin_memory=True)) > 1.9 * gpt.rate(
        cfg(16, "bf16", workers=16, pin_memory=True))
    assert gpt.nearest(cfg(8192)).failure == OUT_OF_MEMORY and gpt.nearest(cfg(4096)).samples_per_s


def test_nearest_is_the_recorded_point_for_every_recorded_configuration():
    for path in landscapes():
        found = Landscape.load(path)
        for p in found.ran:
            assert found.nearest(p.config).index == p.index, (path, p.config.short())


def test_nearest_agrees_on_the_most_knobs_then_the_closest_batch(tmp_path):
    found = Landscape.load(small(tmp_path, [
        point(cfg(64), 1000.0),                                        # 0
        point(cfg(256), 3000.0),                                       # 1
        point(cfg(1024), 6000.0),                                      # 2
        point(cfg(256, "bf16"), 4000.0),                               # 3
        point(cfg(64, compile="default"), 1500.0),                     # 4
        point(cfg(256, workers=4, pin_memory=True), 3500.0),           # 5
        point(cfg(256, cudnn_benchmark=True), 3300.0),                 # 6
    ]))

    def near(c: TrialConfig) -> int:
        return found.nearest(c).index
    assert near(cfg(100)) == 0 and near(cfg(200)) == 1  # the closest batch in log2
    assert near(cfg(256, "bf16")) == 3 and near(cfg(4096, "bf16")) == 3  # its precision, however far the batch
    assert near(cfg(64, "fp16")) == 3  # fp16 as its kin bf16, where none ran
    assert near(cfg(64, compile="default")) == 4 and near(cfg(64, compile="max-autotune-no-cudagraphs")) == 0
    assert near(cfg(256, workers=3, pin_memory=True)) == 5 and workers_bucket(3) == workers_bucket(4)
    assert near(cfg(256, workers=16, pin_memory=True)) == 5  # a bucket apart, but closer than none
    assert near(cfg(1024, cudnn_benchmark=True)) == 6
    assert near(cfg(1024, "bf16", cudnn_benchmark=True)) == 3  # one knob apart from 3 and 6: the first


def test_the_rate_corrects_the_nearest_point_by_the_recorded_pairs(tmp_path):
    found = Landscape.load(small(tmp_path, [
        point(cfg(64), 1000.0),                                        # 0
        point(cfg(256), 3000.0),                                       # 1
        point(cfg(1024), 6000.0),                                      # 2
        point(cfg(256, "bf16"), 4000.0),                               # 3
        point(cfg(256, cudnn_benchmark=True), 3300.0),                 # 4
        point(cfg(256, "bf16", compile="default", workers=8, pin_memory=True), 8000.0),  # 5
        point(cfg(256, "bf16", workers=8, pin_memory=True), 5000.0),   # 6
        point(cfg(256, "bf16", pin_memory=True), 4100.0),              # 7
    ]))
    for p in found.ran:  # a recorded configuration: as recorded
        assert found.rate(p.config) == p.samples_per_s and not found.replay(p.config).pairs
    # the batch, as the recorded batches of the nearest's kind went: 256 -> 1024 doubled fp32's rate
    assert found.rate(cfg(1024, "bf16")) == pytest.approx(4000.0 * 6000 / 3000)
    assert found.rate(cfg(64, "fp16")) == pytest.approx(4000.0 * 1000 / 3000)
    assert found.rate(cfg(1024, cudnn_benchmark=True)) == pytest.approx(3300.0 * 6000 / 3000)
    # two knobs: each by its own pair
    assert found.rate(cfg(1024, "bf16", cudnn_benchmark=True)) == pytest.approx(4000.0 * 1.1 * 2)
    # compiled without workers: as uncompiled without them, with the compile's gain with them
    assert found.nearest(cfg(256, "bf16", compile="default")).index == 3
    assert found.rate(cfg(256, "bf16", compile="default")) == pytest.approx(4000.0 * 8000 / 5000)
    assert found.nearest(cfg(256, "bf16", compile="default", pin_memory=True)).index == 7
    assert found.rate(cfg(256, "bf16", compile="default", pin_memory=True)) == pytest.approx(4100.0 * 8000 / 5000)
    # compiled with 16 workers, unpinned: as with 8 (a bucket apart, never recorded), less what
    # pinning gave without workers
    assert found.nearest(cfg(256, "bf16", compile="default", workers=16)).index == 5
    assert found.rate(cfg(256, "bf16", compile="default", workers=16)) == pytest.approx(8000.0 * 4000 / 4100)
    # a batch never recorded, or a knob never varied: as the nearest point ran
    assert found.rate(cfg(512, "bf16")) == 4000.0
    assert found.rate(cfg(256, expandable_segments=True)) == 3000.0
    # a pair that moves another knob too corrects nothing: 3 -> 6 adds workers as it pins
    only = Landscape.load(small(tmp_path, [point(cfg(256, "bf16"), 4000.0),
                                           point(cfg(256, "bf16", workers=8, pin_memory=True), 5000.0)]))
    assert only.rate(cfg(256, "bf16", pin_memory=True)) == 4000.0


def test_out_of_memory_beyond_a_recorded_failure_or_where_the_peak_would_not_fit(tmp_path):
    found = Landscape.load(small(tmp_path, [
        point(cfg(256), 3000.0, peak=2_500.0),
        point(cfg(1024), 6000.0, peak=10_000.0),
        point(cfg(4096), None, failure=OUT_OF_MEMORY),
        point(cfg(1024, "bf16"), 8000.0, peak=6_000.0),
    ], memory_mb=80_000.0))
    fits = [cfg(1024), cfg(2048), cfg(8192, "bf16"), cfg(4096, grad_accum=4)]  # the last: 1024 a micro-batch
    ooms = [cfg(4096), cfg(8192), cfg(16_384, "bf16"), cfg(4096, "fp16").replace(batch_size=16_384)]
    for c in fits:
        assert not found.out_of_memory(c), c.short()
        assert found.nearest(c).samples_per_s, c.short()
    for c in ooms:
        assert found.out_of_memory(c), c.short()
        assert found.nearest(c).failure == OUT_OF_MEMORY and found.rate(c) == 0.0, c.short()
    # a failure below a point that ran is not the rule: the batch fits where a point of it ran
    again = Landscape.load(small(tmp_path, [point(cfg(512), None, failure=OUT_OF_MEMORY),
                                            point(cfg(1024), 6000.0, peak=1_000.0)]))
    assert not again.out_of_memory(cfg(1024)) and again.out_of_memory(cfg(2048))


def test_the_best_point_a_user_allows():
    found = fixture("fashion_cnn")
    every = found.best()
    assert every.samples_per_s == max(p.samples_per_s or 0 for p in found.points)
    def small_uncompiled(c: TrialConfig) -> bool:
        return c.batch_size <= 512 and c.compile.value == "off"
    best = found.best(small_uncompiled)
    assert small_uncompiled(best.config) and best.samples_per_s < every.samples_per_s
    assert best.samples_per_s == max(p.samples_per_s or 0 for p in found.ran if small_uncompiled(p.config))
    fp32 = found.best(lambda c: c.precision.value == "fp32")
    assert fp32.precision == "fp32" and fp32.samples_per_s < every.samples_per_s
    with pytest.raises(LandscapeError, match="no point that ran is allowed"):
        found.best(lambda c: c.batch_size > 10**6)


def test_a_bad_landscape_is_refused_naming_the_file_and_the_key(tmp_path):
    good = json.loads(landscapes()[0].read_text())
    cases = {
        "no key 'costs'": lambda d: d.pop("costs"),
        "no key 'memory_mb'": lambda d: d.pop("memory_mb"),
        r"costs: no key 'setup_s'": lambda d: d["costs"].pop("setup_s"),
        r"points\[3\]: no key 'spread'": lambda d: d["points"][3].pop("spread"),
        r"points\[0\]: key 'config' has no 'batch_size'": lambda d: d["points"][0]["config"].pop("batch_size"),
        r"points\[2\]: key 'samples_per_s' is 'fast'": lambda d: d["points"][2].update(samples_per_s="fast"),
        "key 'points' holds no points": lambda d: d.update(points=[]),
    }
    for i, (message, spoil) in enumerate(cases.items()):
        doc = json.loads(json.dumps(good))
        spoil(doc)
        bad = tmp_path / f"bad{i}.json"
        bad.write_text(json.dumps(doc))
        with pytest.raises(LandscapeError, match=message) as caught:
            Landscape.load(bad)
        assert str(bad) in str(caught.value)
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(LandscapeError, match=f"{broken}: not a landscape file"):
        Landscape.load(broken)
    assert isinstance(Landscape.load(landscapes()[0]).points[0], Point)


# --- the replay ---------------------------------------------------------------------------------------


def node_for(found: Landscape, *, seed: int = 0) -> LandscapeNode:
    return LandscapeNode(recorded_machine("h100x1"), found, seed=seed)


@pytest.mark.parametrize("name", ["fashion_cnn", "tiny_gpt"])
def test_the_node_runs_a_recorded_configuration_at_its_recorded_rate(name, tmp_path):
    found = fixture(name)
    node = node_for(found)
    chosen = [found.nearest(cfg(found.user_batch)), found.best(),
              found.best(lambda c: c.compile.value == "reduce-overhead"),
              found.best(lambda c: c.batch_size == 256 and c.num_workers == 4)]
    scores = []  # each window's departure from the recorded rate, in its normal sd (spread / 1.35)
    for p in chosen:
        sd = p.spread / 1.35
        values = [node.run(p.config, name=f"t{i}").value or 0.0 for i in range(60)]
        assert all(abs(v / (p.samples_per_s or 1) - 1) < 5 * sd for v in values), (p.config.short(), values[:5])
        assert statistics.mean(values) == pytest.approx(p.samples_per_s, rel=sd)
        assert len(set(values)) > 50  # noise, not one value
        scores += [(v / (p.samples_per_s or 1) - 1) / sd for v in values]
    assert 0.8 < statistics.stdev(scores) < 1.2 and abs(statistics.mean(scores)) < 0.25
    # deterministic: the same seed, the same windows; another seed, others
    again, other = node_for(found), node_for(found, seed=1)
    first = [node_for(found).throughput(p.config) for p in chosen]
    assert [again.throughput(p.config) for p in chosen] == first
    assert [other.throughput(p.config) for p in chosen] != first


@pytest.mark.parametrize("name", ["fashion_cnn", "tiny_gpt"])
def test_the_node_reports_the_recorded_memory_setup_and_compile(name):
    found = fixture(name)
    node = node_for(found)
    assert node.devices[0].memory_bytes == int(found.memory_mb * 2**20)
    user = found.nearest(cfg(found.user_batch))
    result = node.run(user.config, name="fresh")
    assert result.status == "ok" and result.phases["start_import_s"] == found.header["costs"]["setup_s"]
    assert result.summary()["cuda_peak_mb"] == pytest.approx(user.peak_mb, rel=1e-6)
    twice = user.config.replace(batch_size=2 * user.batch)
    if found.nearest(twice).batch == 2 * user.batch:
        twice = user.config.replace(batch_size=3 * user.batch)  # between two recorded batches
    near = found.nearest(twice)
    assert node.rank_bytes(twice) == pytest.approx(near.peak_mb * twice.batch_size / near.batch * 2**20, rel=1e-6)
    compiled = found.best(lambda c: c.compile.value == "default")
    cold = node.run(compiled.config, name="cold")
    assert cold.one_time_s == pytest.approx(found.compile_s("default"))
    assert found.compile_s("default") == found.header["costs"]["compile_s"]["default"]
    warm_cache = node.run(compiled.config, name="from the cache")
    assert warm_cache.one_time_s == pytest.approx(found.header["costs"]["recompile_s"])


def test_the_node_runs_out_of_memory_where_the_landscape_says():
    gpt = fixture("tiny_gpt")
    node = node_for(gpt)
    oom = node.run(cfg(8192), name="fp32 8192")
    assert oom.status == "failed" and oom.failure == OUT_OF_MEMORY, oom
    assert node.run(cfg(8192, grad_accum=2), name="two micro-batches").status == "ok"
    assert node.run(cfg(4096), name="fp32 4096").status == "ok"
    fashion = fixture("fashion_cnn")
    huge = cfg(2**20, "bf16", workers=16, pin_memory=True)  # its peak scaled with the batch exceeds 80 GB
    assert fashion.out_of_memory(huge) and not fashion.out_of_memory(huge.replace(batch_size=2**16))
    assert node_for(fashion).run(huge, name="huge").failure == OUT_OF_MEMORY


# --- the recorder -------------------------------------------------------------------------------------


def tcmalloc_here() -> bool:
    from autotune.probes import probe_machine
    from autotune.runtime.knobs import Allocator

    return bool(probe_machine().allocators.get(Allocator.TCMALLOC))


RECORDER_BUDGET_S = 12  # the batch ladder's first two points, and a few more


@pytest.mark.slow
def test_the_recorder_writes_a_landscape_the_reader_loads(tmp_path):
    """bench/gpu_landscape.py on this machine's CPU for 12 s of measuring: a batch ladder in one
    warm process (the first point's process set up, the second's not), with the header the
    replay reads."""
    out = tmp_path / "tiny.json"
    began = time.monotonic()
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_landscape.py"), "tests/models/tiny_cnn.py",
                           "--out", str(out), "--budget-s", str(RECORDER_BUDGET_S), "--device", "cpu"],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    took = time.monotonic() - began
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    found = Landscape.load(out)
    header = found.header
    assert header["recorded"] is True and header["workload"] == "tests/models/tiny_cnn.py"
    assert header["device_type"] == "cpu" and header["device"].startswith("cpu") and header["memory_mb"] > 0
    assert header["torch"] and header["date"] and header["commit"] and header["host_cores"] >= 1
    assert header["user_batch"] == 16 and header["budget_s"] == RECORDER_BUDGET_S and 0 < header["took_s"] <= took
    assert header["measured_s"] <= RECORDER_BUDGET_S + 15 + 5  # the budget, a cut point's grace
    ladder = [p for p in found.points if p.phase == "ladder"]
    assert [p.batch for p in ladder[:2]] == [16, 32], [p.batch for p in found.points]
    first, second = ladder[:2]
    assert first.ran and second.ran and (second.samples_per_s or 0) > 0
    assert not first.warm and first.setup_s > 0
    if tcmalloc_here():  # the ladder runs on tcmalloc, in one warm process
        assert second.warm and second.setup_s <= first.setup_s  # set up once: a fork of a warm interpreter sets up in a blink too
    else:  # glibc's allocator: each point a process of its own (runner.process_key)
        assert not second.warm and second.setup_s > 0
    assert all(p.peak_mb and p.peak_mb > 0 and p.spread >= 0 for p in found.ran)
    assert header["costs"]["setup_s"] == pytest.approx(statistics.median(p.setup_s for p in found.ran
                                                                         if not p.warm), abs=0.01)
    for p in found.ran:
        assert found.nearest(p.config).index == p.index
    assert "wrote" in done.stdout


# --- the search's policy against the known best --------------------------------------------------------


def tune(found: Landscape, out: Path, *, has_evaluate: bool = True, **options) -> tuple[dict, LandscapeNode]:
    task = load_task(ROOT / found.workload)
    if not has_evaluate:
        task = dataclasses.replace(task, has_evaluate=False)
    node = node_for(found)
    task = dataclasses.replace(task, evaluate_s=node.costs.evaluate_s)  # as the node charges it
    began = time.time()
    out.mkdir(parents=True, exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: began + node.clock)
        pipeline.execute(task, out, pipeline.RunOptions(**options), machine=recorded_machine("h100x1"),
                         runner=node, reporter=Reporter(quiet=True))
    return written_document(out), node


@pytest.fixture(scope="module", params=["fashion_cnn", "tiny_gpt"])
def unbounded(request, tmp_path_factory):
    found = fixture(request.param)
    return (*tune(found, tmp_path_factory.mktemp("unbounded")), found)


@pytest.fixture(scope="module", params=["fashion_cnn", pytest.param("tiny_gpt", marks=pytest.mark.xfail(
    strict=True, reason="every point at 0.9 of the best compiles at batch 4096, and verifying 4096 takes more than "
    "the run: the batch check trains your batch of 16 over the candidate's 163,840 samples (about 105 s at 1,553 "
    "samples/s) from each of two seeds; the search stops at 50 s with no room for a compile, the pick reaches 0.73 "
    "of the best, and the run ends at 372 s, past --timeout 300 (at 265 s with one seed)"))])
def five_minutes(request, tmp_path_factory):
    found = fixture(request.param)
    return (*tune(found, tmp_path_factory.mktemp("timeout"), timeout_s=300.0), found)


@pytest.mark.parametrize("name", ["fashion_cnn", "tiny_gpt"])
def test_under_five_minutes_the_ramp_jumps_to_within_twice_the_knee(name):
    """The ramp's share of --timeout 300 (a quarter of the search's half) from the GPU start:
    from its first two batches' memory it jumps toward the memory knee, then halves the gap to
    where throughput stops rising, ending within a factor of two of the landscape's best batch
    (doubling from the user's batch it ended at 2048 and 512). Each step is as the node runs it."""
    from autotune.search import batch_range
    from autotune.search.starts import gpu_start
    from autotune.search.task_space import build_task_space
    from autotune.sections import SearchOptions

    found = fixture(name)
    task = load_task(ROOT / found.workload)
    machine = recorded_machine("h100x1")
    space = build_task_space(task, machine, SearchOptions.of(pipeline.RunOptions(), task=task))
    start, _ = gpu_start(space, machine)
    node = node_for(found)
    began = time.time()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time", lambda: began + node.clock)
        ramp = batch_range.ramp(node, start, most=batch_range.most_tried(
            found.user_batch, dataset_len=task.dataset_len, has_evaluate=True, gpu=True), limit=None,
            for_s=0.25 * 0.5 * 300)
    knee = found.best().batch
    assert ramp.knee is not None and knee / 2 <= ramp.knee <= 2 * knee, (ramp.knee, ramp.rates, ramp.stopped)
    assert knee <= ramp.top <= 2 * knee and not ramp.memory_bound
    assert node.clock <= 0.25 * 0.5 * 300 + 5 + found.setup_s, node.timeline  # within its share, a step's grace
    assert ramp.start_s is not None and ramp.start_s >= found.setup_s  # its first step's fresh process


@pytest.mark.slow
def test_given_the_time_the_pick_reaches_nine_tenths_of_the_best_point(unbounded):
    """Without --timeout: the expert's start at the ramp's knee, the profile's trials, the
    sampler and the late compiles reach the landscape's best (all of its batches are allowed:
    the model file has evaluate())."""
    doc, node, found = unbounded
    assert doc["verified"], [c["outcome"] for c in doc["candidates"]]
    pick = TrialConfig.from_dict(doc["config"])
    best = found.best()
    assert found.rate(pick) >= 0.9 * (best.samples_per_s or 0), (pick.short(), best.config.short())
    assert doc["steering"]["rounds"], "the leader was profiled"


@pytest.mark.slow
def test_under_five_minutes_the_run_fits_and_the_pick_reaches_most_of_the_best(five_minutes):
    """--timeout 300: verified within it, the pick at least 0.85 of the landscape's best (0.9
    given the time). The search (from the ramp's first step to its last trial) has at least a
    third of the run. The gates train two seeds a verdict at the least, the user's batch
    among them for the batch check (fashion_cnn: about 90 s of gates on this node), so a
    compile, about 30 s cold and 6 s again in each of verification's processes, does not
    fit in what the search is left: the pick is the fastest eager point at the knee."""
    doc, node, found = five_minutes
    timeline = [(n, round(t)) for n, t in node.timeline]
    assert doc["verified"], [c["outcome"] for c in doc["candidates"]]
    assert node.clock <= 300, timeline
    verify_from = next(t for n, t in node.timeline if n.startswith("verify-"))
    assert verify_from >= 300 / 3, timeline
    pick = TrialConfig.from_dict(doc["config"])
    assert found.rate(pick) >= 0.85 * (found.best().samples_per_s or 0), (pick.short(), timeline)
    assert pick.batch_size > found.user_batch
    if "fashion_cnn" in found.workload:  # its data loader is what binds at the user's batch
        assert pick.num_workers >= 4, pick.short()


@pytest.mark.slow
def test_without_evaluate_the_ramp_names_the_faster_batch_it_saw_and_the_flag(tmp_path):
    found = fixture("tiny_gpt")
    doc, node = tune(found, tmp_path / "out", has_evaluate=False, trials=8)
    user = found.user_batch
    assert TrialConfig.from_dict(doc["config"]).batch_size <= 8 * user
    ramped = [b for b, _ in doc["batch"]["ramp"]["rates"]]
    assert max(ramped) > 16 * user, ramped  # on a GPU the ramp climbs past what may be emitted
    said = doc["batch"]["unchecked"]
    assert said and "x your speed" in said and f"--batch-range {user // 4}-" in said, said
