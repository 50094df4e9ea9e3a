"""`autotune init FILE`: a template that passes the contract check as written."""
from __future__ import annotations

import pytest

from autotune.cli import main


@pytest.mark.slow
def test_the_template_passes_the_contract_check(tmp_path, capsys):
    from autotune.task import load_task

    path = tmp_path / "my_model.py"
    assert main(["init", str(path)]) == 0
    task = load_task(path)
    assert task.batch_size == 32 and task.has_evaluate and task.image_inputs
    assert "autotune run" in capsys.readouterr().out


def test_init_never_overwrites_and_names_what_is_wrong(tmp_path, capsys):
    path = tmp_path / "mine.py"
    path.write_text("# my work\n")
    assert main(["init", str(path)]) == 2
    assert path.read_text() == "# my work\n"
    assert "never overwrites" in capsys.readouterr().err
    assert main(["init", str(tmp_path / "model.txt")]) == 2
    assert "ending in .py" in capsys.readouterr().err
