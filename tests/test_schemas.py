"""What autotune prints under --json conforms to the JSON Schemas it ships."""
from __future__ import annotations

import json

import pytest

from autotune import schemas
from autotune.cli import main
from autotune.task import load_task

from helpers import MODELS


def test_the_shipped_schemas_are_valid_json_schemas():
    import jsonschema

    for name in schemas.NAMES:
        jsonschema.Draft202012Validator.check_schema(schemas.load(name))


@pytest.mark.slow
def test_probe_json_conforms(capsys):
    assert main(["probe", "--json"]) == 0
    assert schemas.problem(json.loads(capsys.readouterr().out), "probe") is None


def test_a_run_document_and_show_json_conform(tmp_path, capsys):
    from tests.test_machine_matrix import StandInRunner, machine
    from tests.test_standalone import _tune

    doc = _tune(load_task(MODELS / "knob_cnn.py"), tmp_path, StandInRunner(machine("avx2_epyc")))
    assert schemas.problem(json.loads(json.dumps(doc, default=str)), "best_config") is None
    assert main(["show", str(tmp_path / "out"), "--json"]) == 0
    assert schemas.problem(json.loads(capsys.readouterr().out), "best_config") is None


def test_an_error_under_json_is_json_on_stdout_and_named_on_stderr(tmp_path, capsys):
    assert main(["show", str(tmp_path / "nowhere"), "--json"]) == 2
    captured = capsys.readouterr()
    error = json.loads(captured.out)
    assert schemas.problem(error, "error") is None
    assert error["command"] == "show" and "no such file" in error["error"]
    assert "no such file" in captured.err


def test_a_document_that_breaks_the_schema_is_described_where_it_breaks():
    assert schemas.problem({"config": {}}, "best_config") == (
        "at the top level, 'schema' is a required property")
