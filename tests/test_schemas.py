"""What autotune prints under --json conforms to the JSON Schemas it ships."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from autotune import schemas
from autotune.cli import main
from autotune.config import TrialConfig
from autotune.document.run import RunDocument

from doubles import StandInRunner, recorded_machine, tune_stand_in
from helpers import knob_cnn


def test_the_shipped_schemas_are_valid_json_schemas():
    import jsonschema

    for name in schemas.NAMES:
        jsonschema.Draft202012Validator.check_schema(schemas.load(name))


@pytest.mark.slow
def test_probe_json_conforms(capsys):
    assert main(["probe", "--json"]) == 0
    assert schemas.problem(json.loads(capsys.readouterr().out), "probe") is None


def written(out: Path) -> dict:
    """best_config.json as the run wrote it into ``out``."""
    return json.loads((out / "best_config.json").read_text())


def test_a_run_document_and_show_json_conform(tmp_path, capsys):
    tune_stand_in(knob_cnn(), tmp_path, StandInRunner(recorded_machine("avx2_epyc")))
    assert schemas.problem(written(tmp_path / "out"), "best_config") is None
    assert main(["show", str(tmp_path / "out"), "--json"]) == 0
    assert schemas.problem(json.loads(capsys.readouterr().out), "best_config") is None


@pytest.fixture(scope="module")
def stand_in_document(tmp_path_factory) -> dict:
    """A whole best_config.json of a stand-in run (ablation, path, layout effect and all)."""
    folder = tmp_path_factory.mktemp("run")
    tune_stand_in(knob_cnn(), folder, StandInRunner(recorded_machine("avx2_epyc")))
    return written(folder / "out")


def test_the_schema_rejects_an_ablation_missing_a_key_or_with_a_mistyped_field(stand_in_document):
    doc = stand_in_document
    assert doc["ablation"]["knobs"] and schemas.problem(doc, "best_config") is None
    missing = {**doc, "ablation": {k: v for k, v in doc["ablation"].items() if k != "knobs"}}
    assert "'knobs' is a required property" in schemas.problem(missing, "best_config")
    knob = {**doc["ablation"]["knobs"][0], "kept": "yes"}
    mistyped = {**doc, "ablation": {**doc["ablation"], "knobs": [knob]}}
    assert "ablation.knobs.0.kept" in schemas.problem(mistyped, "best_config")
    extra = {**doc, "ablation": {**doc["ablation"], "speedup": 2.0}}
    assert schemas.problem(extra, "best_config") is not None


def test_a_run_document_reads_back_as_itself(stand_in_document):
    doc = RunDocument.from_json(stand_in_document)
    assert RunDocument.from_json(doc.to_json()) == doc
    assert doc.to_json() == stand_in_document


def test_an_unverified_run_has_no_speedup(tmp_path):
    class NothingPays(StandInRunner):
        def throughput(self, cfg: TrialConfig) -> float:
            return 1000.0

    tune_stand_in(knob_cnn(), tmp_path, NothingPays(recorded_machine("avx2_epyc")))
    doc = written(tmp_path / "out")
    assert not doc["verified"] and doc["speedup"] is None and doc["best"] is None
    assert schemas.problem(doc, "best_config") is None
    assert RunDocument.from_json(doc).to_json() == doc
    assert main(["show", str(tmp_path / "out")]) == 0


# A real run's whole document: tests/test_api.py, on the run it shares with the API's tests.


def test_an_error_under_json_is_json_on_stdout_and_named_on_stderr(tmp_path, capsys):
    assert main(["show", str(tmp_path / "nowhere"), "--json"]) == 2
    captured = capsys.readouterr()
    error = json.loads(captured.out)
    assert schemas.problem(error, "error") is None
    assert error["command"] == "show" and "no such file" in error["error"]
    assert "no such file" in captured.err


def test_a_document_that_breaks_the_schema_is_described_where_it_breaks():
    found = schemas.problem({"config": {}}, "best_config")
    assert found is not None and found.startswith("at the top level, ") and found.endswith("is a required property")


EARLIER = Path(__file__).parent / "fixtures" / "documents"


@pytest.mark.parametrize("name", sorted(p.name for p in EARLIER.glob("best_config_*.json")))
def test_a_document_an_earlier_version_wrote_reads_back_as_itself(name):
    """best_config.json as 55ea3ca wrote it (a stand-in run; with --path and --train-steps):
    read into its types and written again, it is the same document, and the schema holds it."""
    earlier = json.loads((EARLIER / name).read_text())
    assert RunDocument.from_json(earlier).to_json() == earlier
    assert schemas.problem(earlier, "best_config") is None


def test_a_document_read_into_its_types_refuses_a_mistyped_part_naming_where_it_is():
    """Each part of best_config.json is read by its type (pydantic), not by key: a value of
    the wrong type is refused with its path, where a reader by key took it as it was."""
    from pydantic import ValidationError

    earlier = json.loads((EARLIER / "best_config_55ea3ca_path_plan.json").read_text())
    mistyped = {**earlier, "search": {**earlier["search"], "ranking": [{"config": "x", "samples_per_s": "fast"}]}}
    with pytest.raises(ValidationError, match=r"search\.ranking\.0\.samples_per_s"):
        RunDocument.from_json(mistyped)
    plan = {**earlier["plan"], "chosen": {**earlier["plan"]["chosen"], "predicted_s": [1]}}
    with pytest.raises(ValidationError, match=r"plan\.chosen\.predicted_s"):
        RunDocument.from_json({**earlier, "plan": plan})
    # what a part leaves out where it did not happen stays out, and reads back as absent
    assert "ablation" not in RunDocument.from_json({k: v for k, v in earlier.items() if k != "ablation"}).to_json()


def test_an_interval_reads_either_spelling_and_writes_the_published_one():
    from autotune.document.interval import Interval

    spelled = Interval(ratio=1.5, low=1.2, high=1.9, level=0.95)
    assert Interval.from_json({"median": 1.5, "ci_low": 1.2, "ci_high": 1.9, "ci_level": 0.95}) == spelled
    assert Interval.from_json({"median": 1.5, "low": 1.2, "high": 1.9, "level": 0.95}) == spelled
    assert Interval.from_json({"ratio": 1.5, "ci_low": 1.2, "ci_high": 1.9, "ci_level": 0.95}) == spelled
    assert Interval.around(1.5, spelled.bounds_json()) == spelled
    assert spelled.to_json() == {"median": 1.5, "ci_low": 1.2, "ci_high": 1.9, "ci_level": 0.95}
    assert list(spelled.to_json(centre="ratio")) == ["ratio", "ci_low", "ci_high", "ci_level"]


def test_the_best_config_schema_is_the_one_its_types_generate():
    """best_config.schema.json is generated from RunDocument and its parts: a field added to
    a part and not to the shipped schema fails here, and the schema holds what a part writes
    among its parent's keys (an interval's, the standalone check's speedup)."""
    from autotune.document.run import run_document_schema

    assert schemas.load("best_config") == run_document_schema(), (
        "regenerate it: python -c 'from autotune.document.run import write_schema; write_schema()'")
    parts = schemas.load("best_config")["$defs"]
    assert {"ratio", "ci_low", "ci_high", "ci_level"} <= set(parts["LayoutEffect"]["required"])
    assert "effect" not in parts["LayoutEffect"]["properties"]
    assert parts["VerifiedSpeedup"]["properties"]["median_interval"]["required"] == ["low", "high", "level"]
    assert {"samples", "batch_size", "description", "break_even"} <= set(parts["PlanPrediction"]["required"])


def test_the_probe_schema_is_the_one_its_types_generate():
    """probe.schema.json is generated from the probe document's types: a field added to
    Machine (or one of its parts) and not to the shipped schema fails here."""
    from autotune.commands.probe import probe_schema

    assert schemas.load("probe") == probe_schema(), (
        "regenerate it: python -c 'from autotune.commands.probe import write_schema; write_schema()'")


def test_a_probe_document_an_earlier_version_wrote_reads_into_its_types_as_itself():
    """``probe --json`` as 55ea3ca printed it on a 2-core EPYC: read into Machine (pydantic,
    typed) and written again, the machine's part is the same; the whole conforms to the schema."""
    from autotune.probes import Machine

    earlier = json.loads((EARLIER / "probe_55ea3ca.json").read_text())
    machine = {k: v for k, v in earlier.items() if k not in ("fingerprint_id", "space")}
    assert Machine.from_json(machine).to_json() == machine
    assert schemas.problem(earlier, "probe") is None


def test_a_probe_document_with_a_mistyped_section_is_refused_naming_it():
    from pydantic import ValidationError

    from autotune.probes import Machine

    earlier = json.loads((EARLIER / "probe_55ea3ca.json").read_text())
    with pytest.raises(ValidationError, match="cpu.usable_cores"):
        Machine.from_json({**earlier, "cpu": {**earlier["cpu"], "usable_cores": "two"}})


def test_the_error_schema_is_the_one_its_type_generates(capsys):
    from autotune.cli import error_schema

    assert schemas.load("error") == error_schema(), (
        "regenerate it: python -c 'from autotune.cli import write_schema; write_schema()'")
    assert main(["show", "/nonexistent/folder", "--json"]) != 0
    printed = json.loads(capsys.readouterr().out)
    assert schemas.problem(printed, "error") is None and printed["command"] == "show"
