"""autotune.runtime.loop_patch: the edits of a user's script, as the trials run them (compiled)
and as the user gets them (diff): the DataLoader's keyword arguments and inserted statements."""
from __future__ import annotations

import shutil
import subprocess
import textwrap
import traceback
from pathlib import Path
from typing import Any

import pytest

from autotune.runtime.loop_patch import PatchError, compiled, diff, patched


def _loader(line: int, **kwargs: str) -> dict[str, Any]:
    return {"loader": {"line": line, "kwargs": kwargs}}


def _after(line: int, *statements: str) -> dict[str, Any]:
    return {"after": {"line": line, "statements": list(statements)}}


def _script(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


# --- loader -------------------------------------------------------------------------------

def test_an_existing_keyword_has_its_value_replaced() -> None:
    source = "loader = DataLoader(ds, batch_size=64, num_workers=0)  # workers\n"
    assert patched(source, _loader(1, num_workers="4")) == "loader = DataLoader(ds, batch_size=64, num_workers=4)  # workers\n"


def test_a_value_is_found_by_its_utf8_columns() -> None:
    # ast's columns count bytes: "é" and "ü" are two bytes each, so a character slice would be off
    source = 'données = DataLoader(ds, collate_fn=f("ü"), num_workers=(0))\n'
    assert patched(source, _loader(1, num_workers="2", collate_fn="g")) == 'données = DataLoader(ds, collate_fn=g, num_workers=(2))\n'


def test_keywords_are_added_to_a_single_line_call() -> None:
    source = "x = 1\nloader = DataLoader(ds, batch_size=4)\n"
    edits = _loader(2, num_workers="2", persistent_workers="True", pin_memory="False")
    assert patched(source, edits) == "x = 1\nloader = DataLoader(ds, batch_size=4, num_workers=2, persistent_workers=True, pin_memory=False)\n"


def test_a_call_laid_out_one_argument_a_line_gets_one_line_a_keyword() -> None:
    source = _script("""
        loader = DataLoader(
            ds,
            batch_size=4,  # small
        )
    """)
    assert patched(source, _loader(1, num_workers="2", pin_memory="True")) == _script("""
        loader = DataLoader(
            ds,
            batch_size=4,  # small
            num_workers=2,
            pin_memory=True,
        )
    """)


def test_a_multiline_call_without_trailing_comma_gets_the_keywords_after_its_last_argument() -> None:
    source = _script("""
        loader = DataLoader(
            ds,
            batch_size=4
        )
    """)
    assert patched(source, _loader(1, num_workers="2")) == _script("""
        loader = DataLoader(
            ds,
            batch_size=4, num_workers=2
        )
    """)


def test_a_trailing_comma_on_one_line_stays_last() -> None:
    source = "loader = DataLoader(ds, batch_size=4,)\n"
    assert patched(source, _loader(1, num_workers="2")) == "loader = DataLoader(ds, batch_size=4, num_workers=2,)\n"


def test_an_empty_call_gets_the_keywords_alone() -> None:
    assert patched("loader = DataLoader()\n", _loader(1, num_workers="2", pin_memory="True")) == (
        "loader = DataLoader(num_workers=2, pin_memory=True)\n")


def test_a_qualified_dataloader_is_found_among_other_calls_on_its_line() -> None:
    source = "loader = wrap(torch.utils.data.DataLoader(make(ds), batch_size=4))\n"
    assert patched(source, _loader(1, num_workers="2")) == (
        "loader = wrap(torch.utils.data.DataLoader(make(ds), batch_size=4, num_workers=2))\n")


def test_a_positional_argument_has_its_value_replaced() -> None:
    source = "loader = DataLoader(ds, 64, True)\n"
    assert patched(source, _loader(1, batch_size="128", shuffle="False", num_workers="2")) == (
        "loader = DataLoader(ds, 128, False, num_workers=2)\n")


def test_keywords_follow_a_double_star_argument() -> None:
    assert patched("loader = DataLoader(ds, **options)\n", _loader(1, num_workers="2")) == (
        "loader = DataLoader(ds, **options, num_workers=2)\n")


def test_a_starred_argument_that_may_pass_the_keyword_is_refused() -> None:
    with pytest.raises(PatchError, match=r"line 1: .*\*arguments may pass batch_size"):
        patched("loader = DataLoader(*args)\n", _loader(1, batch_size="8"))
    # past the starred argument's position, nothing is ambiguous
    assert patched("loader = DataLoader(ds, 4, *rest)\n", _loader(1, batch_size="8")) == "loader = DataLoader(ds, 8, *rest)\n"


def test_a_line_without_a_dataloader_call_is_an_error_naming_it() -> None:
    source = _script("""
        ds = make()
        loader = wrap(
            DataLoader(ds)
        )
    """)
    with pytest.raises(PatchError, match=r"^line 2: no DataLoader\(\.\.\.\) call starts on this line \(DataLoader calls: lines 3\)"):
        patched(source, _loader(2, num_workers="2"))


# --- after --------------------------------------------------------------------------------

def test_statements_inserted_in_a_function_body_keep_its_indentation() -> None:
    source = _script("""
        def main():
            model = Net()
            for batch in loader:
                step(model, batch)
    """)
    assert patched(source, _after(2, "model.compile()", "model.train()")) == _script("""
        def main():
            model = Net()
            model.compile()
            model.train()
            for batch in loader:
                step(model, batch)
    """)


def test_statements_inserted_at_module_level() -> None:
    assert patched("model = Net()\nrun(model)\n", _after(1, "model.compile()")) == "model = Net()\nmodel.compile()\nrun(model)\n"


def test_a_statement_over_several_lines_is_followed_after_its_last_line() -> None:
    source = _script("""
        model = Net(
            width=4,
        )  # the model
        total = 1 + \\
            2
        run(model)
    """)
    assert patched(source, _after(2, "model.compile()")) == _script("""
        model = Net(
            width=4,
        )  # the model
        model.compile()
        total = 1 + \\
            2
        run(model)
    """)
    assert patched(source, _after(4, "print(total)")).splitlines()[4:6] == ["    2", "print(total)"]


def test_statements_follow_every_statement_sharing_the_line() -> None:
    source = "x = (\n    1); y = (\n    2); z = (\n    3)\nv = 4\n"
    assert patched(source, _after(1, "w = 0")) == "x = (\n    1); y = (\n    2); z = (\n    3)\nw = 0\nv = 4\n"


@pytest.mark.parametrize("line", [2, 3, 4, 9])
def test_a_line_in_no_simple_statement_is_an_error_naming_it(line: int) -> None:
    source = "x = 1\n\n# a comment\nfor b in loader:\n    step(b)\n"
    with pytest.raises(PatchError, match=rf"^line {line}: no simple statement"):
        patched(source, _after(line, "model.compile()"))


def test_a_statement_on_the_line_of_a_compound_header_is_an_error() -> None:
    # inserted at the line's indentation it would run after the loop, not in it
    with pytest.raises(PatchError, match=r"^line 1: the statement shares its line with a compound statement's header"):
        patched("for b in loader: step(b)\n", _after(1, "model.compile()"))


def test_crlf_line_endings_are_kept() -> None:
    assert patched("a = 1\r\nb = 2\r\n", _after(1, "c = 3")) == "a = 1\r\nc = 3\r\nb = 2\r\n"


# --- both, errors -------------------------------------------------------------------------

SCRIPT = _script("""
    import torch
    from torch.utils.data import DataLoader


    def main(ds):
        loader = DataLoader(
            ds,
            batch_size=4,
        )
        model = torch.nn.Linear(2, 2)
        for batch in loader:
            model(batch)
""")
BOTH = {**_loader(6, num_workers="2", pin_memory="True"), **_after(10, "model.compile()")}


def test_both_edits_apply_together_on_the_original_lines() -> None:
    assert patched(SCRIPT, BOTH) == _script("""
        import torch
        from torch.utils.data import DataLoader


        def main(ds):
            loader = DataLoader(
                ds,
                batch_size=4,
                num_workers=2,
                pin_memory=True,
            )
            model = torch.nn.Linear(2, 2)
            model.compile()
            for batch in loader:
                model(batch)
    """)
    # an insertion above the DataLoader call does not move the call's edit
    edits = {**_loader(6, num_workers="2"), **_after(2, "import os")}
    assert patched(SCRIPT, edits).splitlines()[1:11] == [
        "from torch.utils.data import DataLoader", "import os", "", "", "def main(ds):", "    loader = DataLoader(",
        "        ds,", "        batch_size=4,", "        num_workers=2,", "    )"]


def test_no_edits_leave_the_source_as_it_is() -> None:
    assert patched(SCRIPT, {}) is SCRIPT
    assert patched(SCRIPT, {"loader": None, "after": None}) is SCRIPT


def test_an_unknown_edit_or_a_value_that_breaks_the_script_is_an_error() -> None:
    with pytest.raises(PatchError, match="unknown edits"):
        patched(SCRIPT, {"loaders": {"line": 6, "kwargs": {}}})
    with pytest.raises(PatchError, match="the patched script does not parse"):
        patched(SCRIPT, _loader(6, num_workers="2 +"))


# --- compiled -----------------------------------------------------------------------------

RAISING = _script("""
    def main():
        ds = [1, 2]
        loader = DataLoader(
            ds,
            batch_size=4,
        )
        model = 1
        raise RuntimeError("boom")
""")


def _failing_line(code: Any) -> int:
    def data_loader(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
        return args, kwargs

    namespace: dict[str, Any] = {"DataLoader": data_loader, "__name__": "__main__"}
    exec(code, namespace)
    with pytest.raises(Exception) as raised:
        namespace["main"]()
    frame = traceback.extract_tb(raised.value.__traceback__)[-1]
    assert frame.filename == "train.py"
    assert frame.lineno is not None
    return frame.lineno


def test_compiled_code_raises_on_the_original_line() -> None:
    # three lines inserted above line 8: the patched text raises on line 11
    edits = {**_loader(3, num_workers="2"), **_after(2, "a = 0", "b = 0")}
    assert patched(RAISING, edits).splitlines()[10] == '    raise RuntimeError("boom")'
    assert _failing_line(compiled(RAISING, edits, "train.py")) == 8


def test_inserted_statements_carry_the_end_line_of_the_statement_they_follow() -> None:
    code = compiled(RAISING, _after(4, "model = None", "model.compile()"), "train.py")
    assert _failing_line(code) == 6  # the DataLoader call's closing line, which the insertion follows
    code = compiled(RAISING, {**_loader(3, num_workers="2"), **_after(7, "model.compile()")}, "train.py")
    assert _failing_line(code) == 7


def test_an_inserted_statement_over_several_lines_compiles_on_one_original_line() -> None:
    # its lines all become line 2, where its columns run backwards: compile() refuses that range
    edits = _after(2, "total = a_long_name + (\n1)", "raise ValueError(total)")
    assert patched(RAISING, edits).splitlines()[2:4] == ["    total = a_long_name + (", "    1)"]
    namespace: dict[str, Any] = {"a_long_name": 1}
    exec(compiled(RAISING, edits, "train.py"), namespace)
    with pytest.raises(ValueError) as raised:
        namespace["main"]()
    assert traceback.extract_tb(raised.value.__traceback__)[-1].lineno == 2


def test_the_script_compiles_with_its_own_future_flags() -> None:
    # this module and loop_patch both import annotations from __future__; the script does not,
    # so its annotations are objects, not strings
    code = compiled("def f(x: int) -> None:\n    pass\n", _after(2, "y = 1"), "train.py")
    namespace: dict[str, Any] = {}
    exec(code, namespace)
    assert namespace["f"].__annotations__["x"] is int


# --- diff ---------------------------------------------------------------------------------

def _apply_with(tool: str, folder: Path, name: str, source: str, patch: str) -> str:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(source.encode())
    (folder / "tuned.patch").write_bytes(patch.encode())
    if tool == "git":
        if shutil.which("git") is None:
            pytest.skip("needs git")
        subprocess.run(["git", "init", "-q"], cwd=folder, check=True)
        command = ["git", "apply", "tuned.patch"]
    else:
        if shutil.which("patch") is None:
            pytest.skip("needs the Debian package patch")
        command = ["patch", "-p1", "--batch", "--input", "tuned.patch"]
    subprocess.run(command, cwd=folder, check=True, capture_output=True)
    return path.read_bytes().decode()


@pytest.mark.parametrize("tool", ["git", "patch"])
@pytest.mark.parametrize("case", ["both", "no final newline", "crlf"])
def test_the_diff_applies_to_the_patched_script(tool: str, case: str, tmp_path: Path) -> None:
    source, edits = {
        "both": (SCRIPT, BOTH),
        "no final newline": (SCRIPT.rstrip("\n"), {**_loader(6, num_workers="2"), **_after(12, "print('done')")}),
        "crlf": (SCRIPT.replace("\n", "\r\n"), BOTH),
    }[case]
    patch = diff(source, edits, "scripts/train.py")
    assert patch.startswith("--- a/scripts/train.py\n+++ b/scripts/train.py\n@@ ")
    assert patch.endswith("\n")
    assert _apply_with(tool, tmp_path, "scripts/train.py", source, patch) == patched(source, edits)


def test_a_source_without_final_newline_is_marked_in_the_diff() -> None:
    source = "a = 1\nb = 2"
    assert patched(source, _after(2, "c = 3")) == "a = 1\nb = 2\nc = 3"
    assert diff(source, _after(2, "c = 3"), "t.py") == (
        "--- a/t.py\n+++ b/t.py\n@@ -1,2 +1,3 @@\n a = 1\n-b = 2\n\\ No newline at end of file\n+b = 2\n+c = 3\n"
        "\\ No newline at end of file\n")


def test_no_change_is_an_empty_diff() -> None:
    assert diff(SCRIPT, {}, "train.py") == ""
    assert diff(SCRIPT, _loader(6, batch_size="4"), "train.py") == ""
