"""bench/calibration.py's pure parts: the two-step rate, a run's figures from its
best_config.json, coverage and the table, the rescoring adapter. No processes."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("calibration_bench", ROOT / "bench" / "calibration.py")
assert _spec and _spec.loader
cal = importlib.util.module_from_spec(_spec)
sys.modules["calibration_bench"] = cal
_spec.loader.exec_module(cal)


def test_two_step_rate_removes_what_both_runs_pay():
    # 5 s of start-up and setup, then 100 samples/s at batch 10 (0.1 s a step)
    t1, t2 = 5 + 20 * 0.1, 5 + 120 * 0.1
    assert cal.two_step_rate(20, t1, 120, t2, 10) == pytest.approx(100.0)


@pytest.mark.parametrize("n1, t1, n2, t2", [(20, 1.0, 20, 2.0), (30, 1.0, 20, 2.0), (20, 2.0, 120, 2.0),
                                            (20, 3.0, 120, 2.0)])
def test_two_step_rate_refuses_steps_or_times_out_of_order(n1, t1, n2, t2):
    with pytest.raises(ValueError):
        cal.two_step_rate(n1, t1, n2, t2, 16)


def test_steps_for_and_paired_ratios():
    assert cal.steps_for(3.0, 1000.0, 64) == 47
    assert cal.steps_for(0.1, 10.0, 64) == 3  # the least
    assert cal.paired_ratios([200.0, None, 330.0], [100.0, 100.0, 110.0]) == [2.0, 3.0]


def test_kinds_alternate_from_round_to_round():
    assert [cal.kind_of_round(i) for i in range(4)] == ["independent", "wallclock", "independent", "wallclock"]


def test_wallclock_pairs_alternate_script_and_step_count():
    assert cal.pair_order(0) == [("baseline", 0), ("baseline", 1), ("candidate", 0), ("candidate", 1)]
    assert cal.pair_order(1) == [("candidate", 1), ("candidate", 0), ("baseline", 1), ("baseline", 0)]
    assert cal.pair_order(2) == cal.pair_order(0)


def test_run_record_reads_the_printed_interval_and_the_raw_pairs():
    doc = json.loads((ROOT / "tests" / "fixtures" / "report" / "best_config.json").read_text())
    r = cal.run_record(doc)
    sp = doc["speedup"]
    assert r["speedup"]["median"] == sp["median"]
    assert (r["speedup"]["low"], r["speedup"]["high"], r["speedup"]["level"]) == (sp["ci_low"], sp["ci_high"], 0.95)
    assert r["speedup"]["pairs"] == 6 == len(r["baseline_rates"]) == len(r["candidate_rates"])
    assert r["candidate_rates"] == doc["verification"]["standalone"]["samples_per_s"]
    assert r["baseline_rates"] == doc["verification"]["standalone"]["baseline_samples_per_s"]
    assert (r["batch_size"], r["baseline_batch_size"]) == (512, 64)
    unverified = {**doc, "speedup": None, "verification": {}, "best": None}
    assert cal.run_record(unverified)["speedup"] is None
    assert cal.run_record(unverified)["candidate_rates"] == []


def _run(name, median, low, high, *, base=(100.0, 100.0, 100.0, 100.0, 100.0),
         cand=(150.0, 160.0, 140.0, 155.0, 145.0)):
    return {"kind": "run", "workload": name, "out": f"o/{name}", "exit_code": 0, "config": "1x2 batch=64",
            "speedup": {"median": median, "low": low, "high": high, "level": 0.95, "pairs": len(cand)},
            "baseline_rates": list(base), "candidate_rates": list(cand)}


def _check(name, method, median, t):
    return {"kind": "recheck", "workload": name, "method": method, "median": median, "t": t, "out": f"o/{name}"}


RECORDS = [
    {"kind": "start", "date": "2026-11-26T08:00:00+00:00", "commit": "abc1234", "dirty": False,
     "cpu": "AMD EPYC", "cores": 2},
    _run("a", 1.5, 1.4, 1.6), _run("b", 2.0, 1.5, 2.5),
    {"kind": "run", "workload": "c", "out": "o/c", "exit_code": 3, "speedup": None, "baseline_rates": [],
     "candidate_rates": []},
    _check("a", "independent", 1.45, 0.0), _check("b", "independent", 2.6, 60.0),
    _check("a", "wallclock", 1.70, 600.0), _check("b", "wallclock", 2.4, 660.0),
    _check("a", "independent", None, 1200.0),  # failed: not judged
    _check("b", "independent", 1.6, 1260.0),
]


def test_coverage_per_workload_and_overall():
    rows = {row["workload"]: row for row in cal.workload_rows(RECORDS)}
    assert [(d["kind"], d["inside"]) for d in rows["a"]["rechecks"]] == [
        ("independent", True), ("wallclock", False), ("independent", None)]
    assert (rows["a"]["inside"], rows["a"]["judged"], rows["a"]["coverage"]) == (1, 2, 0.5)
    assert (rows["b"]["inside"], rows["b"]["judged"]) == (2, 3)
    assert rows["b"]["span_min"] == pytest.approx(20.0)
    assert rows["c"]["interval"] is None and rows["c"]["judged"] == 0
    total = cal.overall(list(rows.values()))
    assert (total["inside"], total["judged"]) == (3, 5)
    assert total["by_kind"] == {"independent": (2, 3), "wallclock": (1, 2)}
    # relative widths 0.2/1.5 and 1.0/2.0
    assert total["median_relative_width"] == pytest.approx((0.2 / 1.5 + 0.5) / 2)


def test_a_new_run_of_a_workload_starts_its_rechecks_afresh():
    records = [*RECORDS, _run("a", 1.5, 1.0, 2.0), _check("a", "wallclock", 1.9, 2000.0)]
    row = next(r for r in cal.workload_rows(records) if r["workload"] == "a")
    assert [d["median"] for d in row["rechecks"]] == [1.9]


def test_table_is_markdown_with_a_header_line():
    rows = cal.workload_rows(RECORDS)
    text = cal.render_table(RECORDS, rows)
    lines = text.splitlines()
    assert "commit abc1234" in lines[0] and "2026-11-26" in lines[0] and "AMD EPYC (2 cores)" in lines[0]
    table = [line for line in lines if line.startswith("|")]
    assert len(table) == 2 + 3 and all(line.count("|") == table[0].count("|") for line in table)
    row_a = next(line for line in table if line.startswith("| a |"))
    assert "1.50x (1.40-1.60, 95%, 5 pairs)" in row_a
    assert "I 1.45 in, W 1.70 **out**, I failed" in row_a and "1 of 2 (50%)" in row_a
    assert "not verified (exit 3)" in text
    assert "3 of 5 (60%)" in text and "independent 2 of 3 (67%); wallclock 1 of 2 (50%)" in text


def test_rescore_recomputes_each_interval_from_the_raw_rates():
    from autotune.verify.stats import speedup_interval

    name, fn = cal.interval_function(session_sd=0.0)
    assert "session_sd=0.0" in name
    rows = {row["workload"]: row for row in cal.workload_rows(RECORDS, rescore=fn)}
    iv = rows["a"]["interval"]
    want = speedup_interval([100.0] * 5, [150.0, 160.0, 140.0, 155.0, 145.0], level=0.95, session_sd=0.0)
    assert (iv["median"], iv["low"], iv["high"], iv["lower"]) == pytest.approx(
        (want.interval.ratio, want.interval.low, want.interval.high, want.lower))
    assert iv["low"] < iv["lower"] < iv["median"] < iv["high"]
    assert [d["inside"] for d in rows["a"]["rechecks"]] == [True, False, None]
    assert rows["a"]["rechecks"][0]["above_lower"] is True
    text = cal.render_table(RECORDS, list(rows.values()), title="interval recomputed by x")
    assert "lower bound" in text and "Above the one-sided lower bound" in text


@pytest.mark.parametrize("result", [
    {"median": 1.5, "low": 1.2, "high": 1.8, "lower_bound": 1.3},
    {"median": 1.5, "ci_low": 1.2, "ci_high": 1.8, "lower": 1.3},
    (1.5, 1.2, 1.8, 1.3),
])
def test_the_adapter_reads_the_new_functions_result_whatever_its_shape(result, monkeypatch):
    module = type(sys)("fake_stats")
    seen = {}

    def speedup_interval(baseline_rates, candidate_rates, *, level):
        seen.update(baseline=baseline_rates, candidate=candidate_rates, level=level)
        return result

    module.speedup_interval = speedup_interval
    monkeypatch.setitem(sys.modules, "fake_stats", module)
    name, fn = cal.interval_function("fake_stats:speedup_interval")
    assert fn([1.0, 2.0], [3.0, 4.0], 0.9) == {"median": 1.5, "low": 1.2, "high": 1.8, "lower": 1.3, "level": 0.9}
    assert seen == {"baseline": [1.0, 2.0], "candidate": [3.0, 4.0], "level": 0.9}


def test_run_args_for_every_workload_or_one():
    assert cal._run_args([])["tiny_lm"] == ["--trials", "12"]
    args = cal._run_args(["--trials 4 --timeout 300", "tiny_lm=--trials 2"])
    assert args["fashion_cnn"] == ["--trials", "4", "--timeout", "300"]
    assert args["tiny_lm"] == ["--trials", "2"]


def test_measure_runs_first_then_rounds_round_robin_alternating_and_resumes(tmp_path, monkeypatch):
    calls = []
    fig = {"median": 1.5, "low": 1.2, "high": 1.8, "level": 0.95, "pairs": 5}

    def tune(name, args, folder, *, timeout_s):
        calls.append(("run", name, tuple(args)))
        return {"kind": "run", "workload": name, "out": str(folder / name), "exit_code": 0 if name != "c" else 3,
                "t": 0.0, "speedup": fig if name != "c" else None, "baseline_rates": [1.0] * 5,
                "candidate_rates": [1.5] * 5}

    def check(kind):
        def fake(run, folder, **kwargs):
            calls.append((kind, run["workload"]))
            if len(calls) == 7:
                raise RuntimeError("a script failed")
            return {"median": 1.4, "baseline_rates": [1.0], "candidate_rates": [1.4]}
        return fake

    monkeypatch.setattr(cal, "WORKLOADS", {"a": "a.py", "b": "b.py", "c": "c.py"})
    monkeypatch.setattr(cal, "tune", tune)
    monkeypatch.setattr(cal, "independent_check", check("independent"))
    monkeypatch.setattr(cal, "wallclock_check", check("wallclock"))
    monkeypatch.setattr(cal, "_git", lambda *args: "abc1234")
    monkeypatch.setattr(cal.time, "sleep", lambda s: None)
    argv = ["--out", str(tmp_path), "--workloads", "a", "b", "c", "--rounds", "3", "--run-args=--trials 4"]
    assert cal.main(argv) == 0
    assert calls == [("run", "a", ("--trials", "4")), ("run", "b", ("--trials", "4")), ("run", "c", ("--trials", "4")),
                     ("independent", "a"), ("independent", "b"), ("wallclock", "a"), ("wallclock", "b"),
                     ("independent", "a"), ("independent", "b")]
    records = cal.read_records(tmp_path / cal.RECORDS)
    failed = [r for r in records if r.get("error")]
    assert len(failed) == 1 and failed[0]["median"] is None and failed[0]["method"] == "wallclock"
    assert cal.main(argv) == 2  # records there: --resume, or another folder
    calls.clear()
    assert cal.main([*argv, "--rounds", "4", "--resume"]) == 0
    assert calls == [("wallclock", "a"), ("wallclock", "b")]  # runs and rounds done are kept
