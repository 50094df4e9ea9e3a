"""An option is named in one place: a field of ``RunOptions`` with its ``Flag``. The parser
of ``autotune run`` (and ``autotune verify``), the keywords of ``tune()`` and the options
best_config.json records are built from the fields; an option added there is found in
all three with no other code."""
from __future__ import annotations

import argparse
import dataclasses
import json

import pytest

from autotune import api, schemas
from autotune.cli import build_parser
from autotune.commands import add_options, run_options
from autotune.document.options import options_record
from autotune.document.run import RunDocument
from autotune.errors import UsageError
from autotune.options import FLAG, STORAGE_ENV, Flag, RunOptions, flag_of, parse_size
from autotune.runtime.knobs import Precision

from recorded_run import load_doc


def _megabytes(given, spelled):
    return parse_size(given, flag=spelled) if isinstance(given, str) else given


# Two options declared once each, as a new field of RunOptions would be: a number on the
# command line, and a size parsed from text whose tune() keyword differs from its name.
WithDummies = dataclasses.make_dataclass("WithDummies", [
    ("dummy_seconds", float, dataclasses.field(default=2.5, metadata={FLAG: Flag(
        "--dummy-seconds", number=float, metavar="SECONDS", verify=True,
        help="how long the dummy waits (default %(default)s)")})),
    ("dummy_limit_mb", "float | None", dataclasses.field(default=None, metadata={FLAG: Flag(
        "--dummy-limit", parse=_megabytes, metavar="SIZE", api="dummy_limit",
        help="the dummy's limit, e.g. 1GiB")})),
], bases=(RunOptions,), frozen=True)


def _parsed(*argv: str, verify: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="autotune run")
    add_options(parser, options=WithDummies, verify=verify)
    return parser.parse_args(list(argv))


def test_an_option_declared_once_is_a_flag(capsys, monkeypatch):
    monkeypatch.delenv(STORAGE_ENV, raising=False)
    options = run_options(_parsed("--dummy-seconds", "4", "--dummy-limit", "1GiB", "--trials", "7"),
                          options=WithDummies)
    assert isinstance(options, WithDummies)
    assert (options.dummy_seconds, options.dummy_limit_mb, options.trials) == (4.0, 1024.0, 7)
    assert run_options(_parsed(), options=WithDummies) == WithDummies()

    # verify shares the one marked so, not the other
    shared = run_options(_parsed("--dummy-seconds", "3", verify=True), options=WithDummies)
    assert shared.dummy_seconds == 3.0
    with pytest.raises(SystemExit):
        _parsed("--dummy-limit", "1GiB", verify=True)

    with pytest.raises(SystemExit):
        _parsed("--dummy-seconds", "0")  # a positive number, as every timed flag
    assert "--dummy-seconds must be positive, got 0" in capsys.readouterr().err
    with pytest.raises(UsageError, match="--dummy-limit '1': expected a size with its unit"):
        run_options(_parsed("--dummy-limit", "1"), options=WithDummies)

    with pytest.raises(SystemExit):
        _parsed("--help")
    shown = " ".join(capsys.readouterr().out.split())
    assert "--dummy-seconds SECONDS how long the dummy waits (default 2.5)" in shown
    assert "--dummy-limit SIZE the dummy's limit, e.g. 1GiB" in shown


def test_an_option_declared_once_is_a_keyword_of_tune():
    options = api.run_options(named={"trials": 4}, more={"dummy_seconds": 3.0, "dummy_limit": "2GiB"},
                              options=WithDummies)
    assert isinstance(options, WithDummies)
    assert (options.trials, options.dummy_seconds, options.dummy_limit_mb) == (4, 3.0, 2048.0)
    assert api.run_options(named={}, more={"dummy_limit": 512.0}, options=WithDummies).dummy_limit_mb == 512.0
    with pytest.raises(UsageError, match="unknown option dummy_limit_mb; the options are .*dummy_limit, dummy_seconds"):
        api.run_options(named={}, more={"dummy_limit_mb": 1.0}, options=WithDummies)
    with pytest.raises(UsageError, match="unknown option dummy_seconds"):  # RunOptions itself is untouched
        api.run_options(named={}, more={"dummy_seconds": 1.0})


def test_an_option_declared_once_is_recorded_in_best_config_json():
    record = options_record(WithDummies(dummy_seconds=3.0, dummy_limit_mb=64.0, windows=5))
    assert (record["dummy_seconds"], record["dummy_limit_mb"], record["windows"]) == (3.0, 64.0, 5)
    doc = dataclasses.replace(load_doc(), options=record).to_json()
    assert doc["options"]["dummy_seconds"] == 3.0
    assert schemas.problem(doc, "best_config") is None
    assert RunDocument.from_json(doc).to_json() == doc


def test_the_record_is_json_and_leaves_the_secret_out():
    url = "postgresql://tuner:hunter2@db.example/studies"
    options = RunOptions(storage=url, study="s", batch_range=(16, 64), fixed={"precision": Precision.FP32},
                         memory_limit_mb=6144.0, profile=False)
    record = options_record(options)
    assert set(record) == {f.name for f in dataclasses.fields(RunOptions)} - {"storage"}
    assert (record["batch_range"], record["fixed"], record["profile"]) == ([16, 64], {"precision": "fp32"}, False)
    assert "hunter2" not in json.dumps(record) and "hunter2" not in repr(options)
    assert [f.name for f in dataclasses.fields(RunOptions) if (flag := flag_of(f)) and flag.secret] == ["storage"]


def test_autotune_run_has_a_flag_for_every_option_and_its_defaults_are_the_fields(monkeypatch):
    monkeypatch.delenv(STORAGE_ENV, raising=False)
    run = build_parser().parse_args(["run", "model.py"])
    assert all(hasattr(run, f.name) for f in dataclasses.fields(RunOptions))
    assert run_options(run) == RunOptions()
    verify = build_parser().parse_args(["verify", "out"])
    shared = {f.name for f in dataclasses.fields(RunOptions) if hasattr(verify, f.name)}
    assert shared == {"window_s", "windows", "trial_timeout_s", "hang_timeout_s", "rounds", "pairs",
                      "pair_seconds", "max_quality_drop", "warm_trials"}
    assert run_options(verify) == RunOptions()


def test_the_flags_of_autotune_run_read_into_run_options(monkeypatch):
    monkeypatch.setenv(STORAGE_ENV, "postgresql://u:p@h/db")
    args = build_parser().parse_args([
        "run", "model.py", "--fix", "precision=fp32", "--fix", "nprocs=1", "--exact", "--memory-limit", "6GiB",
        "--batch-range", "16-256", "--no-profile", "--fresh-trials", "--timeout", "60", "--train-steps", "100",
        "--study", "s", "--window", "0.5", "--max-quality-drop", "0", "--scale-lr", "sqrt", "--path"])
    options = run_options(args)
    assert options == RunOptions(
        fixed={"precision": "fp32", "nprocs": 1}, exact=True, memory_limit_mb=6144.0, batch_range=(16, 256),
        profile=False, warm_trials=False, timeout_s=60.0, train_steps=100, study="s", window_s=0.5,
        max_quality_drop=0.0, scale_lr="sqrt", path=True, storage="postgresql://u:p@h/db")
    assert options.storage == "postgresql://u:p@h/db"  # not given: read from the environment
    given = run_options(build_parser().parse_args(["run", "m.py", "--storage", "postgresql://x/y"]))
    assert given.storage == "postgresql://x/y"

    for argv, message in ((["--memory-limit", "6"], "--memory-limit '6': expected a size with its unit, e.g. --memory-limit 6GiB"),
                          (["--batch-range", "64-16"], "--batch-range '64-16': expected LOW-HIGH"),
                          (["--fix", "batchsize=64"], "--fix batchsize: unknown knob"),
                          (["--scale-lr", "cubic"], "--scale-lr 'cubic': expected one of none, linear, sqrt")):
        with pytest.raises(UsageError, match=message):
            run_options(build_parser().parse_args(["run", "m.py", *argv]))


def test_tune_takes_its_named_options_and_every_other_field_by_name():
    named = {"trials": 3, "timeout": 90.0, "fix": {"precision": "fp32"}, "exact": True, "max_quality_drop": None,
             "train_steps": None, "epochs": 2, "memory_limit": "512MiB", "scale_lr": "linear"}
    options = api.run_options(named=named, more={"window_s": 0.2, "batch_range": (8, 64), "warm_trials": False})
    assert options == RunOptions(trials=3, timeout_s=90.0, fixed={"precision": "fp32"}, exact=True, epochs=2,
                                 memory_limit_mb=512.0, scale_lr="linear", window_s=0.2, batch_range=(8, 64),
                                 warm_trials=False)
    assert api.run_options(named={**named, "fix": ["nprocs=1"]}, more={}).fixed == {"nprocs": 1}
    with pytest.raises(UsageError, match="memory_limit '6': expected a size with its unit, e.g. memory_limit 6GiB"):
        api.run_options(named={**named, "memory_limit": "6"}, more={})
    # a named parameter's field name is not a second spelling of it; the rest are listed
    with pytest.raises(UsageError) as refused:
        api.run_options(named=named, more={"timeout_s": 5.0})
    assert str(refused.value) == (
        "tune(): unknown option timeout_s; the options are batch_range, hang_timeout_s, heartbeat_s, metric, "
        "metric_lower_is_better, pair_seconds, pairs, path, profile, rounds, storage, study, top, trial_timeout_s, "
        "verify_wait_s, warm_trials, window_s, windows")
