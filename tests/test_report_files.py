"""report.md and report.html in an output folder: the tables users read, plots that are real
pictures, an HTML page that opens offline, and the commands `autotune report` and
`autotune show` over them."""
from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.commands import report as report_command
from autotune.commands import show as show_command
from autotune.report.files import PLOTS_HINT, write_report
from autotune.search.study import load_study

from recorded_run import ABLATION, build_study, load_doc

PLOTS = ("history.png", "knobs.png", "ablation.png", "path.png", "verification.png")


def make_outdir(folder: Path, *, ablation: bool = True, study: bool = True) -> Path:
    """An output folder as `autotune run` leaves it: best_config.json and study.journal."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = load_doc()
    if ablation:
        doc = dataclasses.replace(doc, ablation=ABLATION)
    (folder / "best_config.json").write_text(json.dumps(doc.to_json(), indent=1))
    if study:
        build_study(folder, doc)
    return folder


def hide_matplotlib(monkeypatch) -> None:
    """Make ``import matplotlib`` fail, as where it is not installed."""
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> tuple[Path, list[Path]]:
    pytest.importorskip("matplotlib")
    out = make_outdir(tmp_path_factory.mktemp("report") / "fashion_cnn")
    return out, write_report(out)


def test_the_report_files_are_written_into_the_output_folder(written):
    out, files = written
    assert files[:2] == [out / "report.md", out / "report.html"]
    assert sorted(p.name for p in files[2:]) == sorted(PLOTS)
    assert all(p.parent == out / "report" for p in files[2:])


def test_report_md_holds_the_summary_advice_and_every_table(written):
    out, _ = written
    md = (out / "report.md").read_text()
    assert "| knob | baseline | chosen |" in md
    assert "| interop_threads | default | 1 ← |" in md and "None" not in md
    assert "- The tuned configuration trains at 2.87x" in md
    assert "  - batch_size 64 -> 512: 1.41x (1.33-1.48) of the winner's speed" in md
    for title in ("## Trials of the search", "## Ablation", "## Verification, side by side",
                  "## Verification, standalone pairs", "## Candidates in verification",
                  "## Not searched on this machine"):
        assert title in md, title
    trials = md.split("## Trials of the search")[1].split("##")[0]
    assert "| 0 | baseline | layout=1xdefault batch=64 | 4,388 | measured |" in trials
    assert "failed: ran out of memory (RuntimeError: out of memory)" in trials
    assert "same configuration as #3" in trials and "2,422 (partial)" in trials
    assert "| 1 | 2.48 | 10,011 |" in md  # the first side-by-side round
    assert "| channels_last | off | on | 1.01x | 0.97-1.06 | removed |" in md
    assert "## The path from the baseline" in md
    assert "| + precision | fp32 -> bf16 | 1.60x | 1.55-1.66 | kept |" in md
    assert "| = the winner over the baseline |  | 2.42x | 2.30-2.55 |  |" in md
    for name in PLOTS:
        assert f"](report/{name})" in md
    assert PLOTS_HINT not in md


def test_the_plots_are_pictures_with_content(written):
    image = pytest.importorskip("matplotlib.image")
    import numpy as np

    out, _ = written
    for name in PLOTS:
        pixels = image.imread(out / "report" / name)
        height, width, channels = pixels.shape
        assert height >= 250 and width >= 600 and channels in (3, 4), (name, pixels.shape)
        rgb = (pixels[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
        colours = np.unique(rgb, axis=0)
        assert len(colours) > 50, (name, len(colours))
        not_white = (rgb < 240).any(axis=1).mean()
        assert 0.01 < not_white < 0.9, (name, not_white)


def test_report_html_is_one_self_contained_page(written):
    out, _ = written
    page = (out / "report.html").read_text()
    assert "http://" not in page and "https://" not in page
    text = re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)
    assert "//" not in text  # no protocol-relative reference either
    images = re.findall(r'<img [^>]*src="([^"]+)"', page)
    assert len(images) == len(PLOTS)
    for src in images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert not re.search(r"<(link|script)\b", page) and "url(" not in page and "@import" not in page
    assert "<table>" in page and "interop_threads" in page


def test_without_matplotlib_the_tables_are_all_there_and_it_says_how_to_get_plots(tmp_path, monkeypatch):
    hide_matplotlib(monkeypatch)
    out = make_outdir(tmp_path / "out")
    files = write_report(out)
    assert [p.name for p in files] == ["report.md", "report.html"]
    md = (out / "report.md").read_text()
    assert PLOTS_HINT in md and "## Trials of the search" in md and "## Ablation" in md
    assert "<img" not in (out / "report.html").read_text()


def test_stale_plots_of_an_earlier_report_are_removed(tmp_path):
    pytest.importorskip("matplotlib")
    out = make_outdir(tmp_path / "out", ablation=False)
    (out / "report").mkdir()
    (out / "report" / "ablation.png").write_bytes(b"old")
    files = write_report(out)
    assert not (out / "report" / "ablation.png").exists()
    assert "ablation.png" not in (out / "report.md").read_text()
    assert {p.name for p in files[2:]} == {"history.png", "knobs.png", "verification.png"}


def test_the_study_is_read_without_being_written(tmp_path):
    out = make_outdir(tmp_path / "out")
    before = (out / "study.journal").read_bytes()
    doc = load_doc()
    study = load_study(out, model_file=doc.model_file, fingerprint_id=doc.fingerprint.get("id"))
    assert study is not None and len(study.trials) == 9
    load_study(out / "best_config.json")  # the file itself names its folder
    assert (out / "study.journal").read_bytes() == before


def test_a_folder_without_a_study_or_with_a_damaged_one_still_gets_its_report(tmp_path, monkeypatch):
    hide_matplotlib(monkeypatch)  # fast: tables only
    out = make_outdir(tmp_path / "plain", study=False)
    write_report(out)
    md = (out / "report.md").read_text()
    assert "No study.journal" in md and "## Trials of the search" not in md and "## Ablation" in md
    torn = make_outdir(tmp_path / "torn")
    with open(torn / "study.journal", "ab") as f:
        f.write(b"{not json\n{\"op_code\": 0}\n")
    write_report(torn)
    assert "the study could not be read" in (torn / "report.md").read_text()


def test_autotune_report_prints_the_files_it_wrote(tmp_path, capsys, monkeypatch):
    hide_matplotlib(monkeypatch)
    out = make_outdir(tmp_path / "out")
    assert report_command.main(argparse.Namespace(out=out)) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / "report.md"), str(out / "report.html")]


def test_autotune_show_details_prints_the_summary_then_the_advice(tmp_path, capsys):
    out = make_outdir(tmp_path / "out")
    assert show_command.main(argparse.Namespace(out=out, json=False, details=False)) == 0
    assert "Changed from the baseline" not in capsys.readouterr().out  # the answer alone
    assert show_command.main(argparse.Namespace(out=out, json=False, details=True)) == 0
    text = capsys.readouterr().out
    assert text.index("baseline: 3,705.7 samples/s") < text.index("Changed from the baseline: layout 1xdefault")
    assert "of the winner's speed" in text and "The search ran 9 trials" in text
    assert text.count("device=cuda: no NVIDIA GPU found") == 1  # listed by the summary only
    assert "None" not in text.split("Changed from the baseline")[1]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
@pytest.mark.skipif(_chromium() is None, reason="no chromium or chromium-browser on PATH (apt-get install chromium)")
def test_report_html_renders_offline_in_a_headless_browser(written, tmp_path):
    """The page as a browser shows it with every network request refused: the plots and
    tables must come from the file alone."""
    image = pytest.importorskip("matplotlib.image")
    import numpy as np

    out, _ = written
    shot = tmp_path / "shot.png"
    command = [_chromium(), "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
               f"--user-data-dir={tmp_path / 'profile'}", "--proxy-server=127.0.0.1:9",
               "--proxy-bypass-list=<-loopback>", f"--screenshot={shot}", "--window-size=1200,3000",
               (out / "report.html").as_uri()]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "HOME": str(tmp_path)})
    assert shot.exists(), done.stderr[-2000:]
    pixels = image.imread(shot)
    assert pixels.shape[:2] == (3000, 1200), pixels.shape
    rgb = (pixels[..., :3] * 255).astype(np.uint8).reshape(-1, 3)
    assert len(np.unique(rgb, axis=0)) > 200  # plots, not just black text on white
    assert (rgb < 240).any(axis=1).mean() > 0.03
    coloured = (rgb.max(axis=1).astype(int) - rgb.min(axis=1)) > 60  # the plots' blue, green, orange
    assert coloured.mean() > 0.002, coloured.mean()


def test_report_md_leads_the_speedup_with_the_figure_a_rerun_stays_above(tmp_path, monkeypatch):
    hide_matplotlib(monkeypatch)
    doc = load_doc()
    assert doc.speedup is not None
    shift = "the baseline's speed drifted from 3,251 to 3,821 samples/s over the pairs"
    doc = dataclasses.replace(doc, speedup=dataclasses.replace(doc.speedup, lower_bound=1.62, speed_shift=shift))
    out = tmp_path / "run"
    out.mkdir()
    (out / "best_config.json").write_text(json.dumps(doc.to_json(), indent=1))
    write_report(out)
    md = (out / "report.md").read_text()
    iv = doc.speedup.interval
    assert (f"| speedup | 1.62x or more in 95% of re-runs (median {iv.ratio:.2f}x, 95% of re-runs within "
            f"{iv.low:.2f}-{iv.high:.2f}x), 6 standalone pairs |") in md, md[:2000]
    assert f"| while verifying | {shift} |" in md
    assert "1.62x or more in 95% of re-runs" in (out / "report.html").read_text()


def test_the_report_leads_with_the_answer_then_the_tables(written):
    """The speedup a re-run stays above and the plot of what each knob is worth come before
    the first table, in report.html and report.md alike."""
    out, _ = written
    page = (out / "report.html").read_text()
    first_table = page.index("<table")
    speedup = page.index("Verified speedup: ")
    worth = page.index('<img alt="Ablation: what each knob is worth"')
    assert speedup < worth < first_table
    assert page.index("knob") > speedup  # the knob table follows
    md = (out / "report.md").read_text()
    first_md_table = md.index("\n| ")
    assert md.index("**Verified speedup: ") < md.index("](report/ablation.png)") < first_md_table
    assert md.index("## Result") > md.index("## The answer")
    assert md.count("](report/ablation.png)") == 1  # shown once, in the answer


def test_a_further_answer_block_slots_in_after_the_speedup(tmp_path, monkeypatch):
    from autotune.report import render

    hide_matplotlib(monkeypatch)
    monkeypatch.setattr(render, "ANSWERS", [*render.ANSWERS,
                                            lambda doc: render.Answer("Utilisation", ["GPU busy 91% of steps."]),
                                            lambda doc: None])
    out = make_outdir(tmp_path / "out", study=False)
    write_report(out)
    for text, table in (((out / "report.html").read_text(), "<table"), ((out / "report.md").read_text(), "\n| ")):
        assert text.index("Verified speedup: ") < text.index("GPU busy 91% of steps.") < text.index(table)
