"""autotune.runtime is one package for two homes: the trial worker imports it as
``autotune.runtime``, and train_tuned.py runs a byte-identical copy as ``tuned_runtime``,
where autotune is not importable (test_emit.py's ``test_script_trains_one_process_without_autotune``
runs it so). Hence: relative imports only, and nothing happens at import; whoever starts a
rank calls ``ranks.bootstrap()`` first, before torch."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

from autotune.config import TrialConfig
from autotune.emit import outputs as emit
from autotune.trials import launch

from helpers import MODELS, REPO, machine_doc

RUNTIME = REPO / "autotune" / "runtime"
MODULES = sorted(RUNTIME.glob("*.py"))


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(level, module) of every import in a file: level 0 is absolute."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(0, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.level, node.module or ""))
    return found


def test_the_runtime_imports_nothing_of_autotune_and_itself_relatively():
    assert len(MODULES) > 5
    for path in MODULES:
        for level, module in imported_modules(path):
            top = module.split(".")[0]
            assert level > 0 or top not in ("autotune", "tuned_runtime"), f"{path.name} imports {module}"


def fresh_python(code: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items()
            if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "TUNED_STORE", "TUNED_NPROCS", "TUNED_CPUS_PER_RANK")}
    return subprocess.run([sys.executable, "-c", code], env={**base, **env}, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_importing_the_runtime_starts_no_rank_pins_nothing_and_prints_nothing(tmp_path):
    """With TUNED_NPROCS=2 and TUNED_CPUS_PER_RANK set, importing every module neither starts
    the ranks nor pins the cores: only ranks.bootstrap() does."""
    marker = tmp_path / "ran"
    names = [f"autotune.runtime.{p.stem}" for p in MODULES if p.stem != "__init__"]
    code = (f"import os\nbefore = os.sched_getaffinity(0)\nimport {', '.join(names)}\n"
            "import psutil\n"
            "assert not psutil.Process().children(), 'a process was started at import'\n"
            "assert os.sched_getaffinity(0) == before, 'the cores were pinned at import'\n"
            f"open({str(marker)!r}, 'a').write(os.environ.get('RANK', 'no rank') + chr(10))\n")
    proc = fresh_python(code, TUNED_NPROCS="2", TUNED_CPUS_PER_RANK=str(min(os.sched_getaffinity(0))))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (proc.stdout, proc.stderr) == ("", "")
    assert marker.read_text().splitlines() == ["no rank"]  # this process, not ranks it started


def test_the_rank_start_up_and_the_workers_top_import_no_torch():
    """ranks.bootstrap() must run before torch is imported, so neither ranks nor the
    worker's own module may import it."""
    for module in ("autotune.runtime.ranks", "autotune.runtime.knobs", "autotune.config", "autotune.trials.worker"):
        proc = fresh_python(f"import sys, {module}; print('torch' in sys.modules)")
        assert proc.returncode == 0 and proc.stdout.strip() == "False", (module, proc.stderr[-2000:])


def test_the_emitted_runtime_is_a_byte_identical_copy_and_the_script_the_template(tmp_path):
    cfg = TrialConfig(threads=1, batch_size=16)
    env, _ = launch.environment(cfg, machine=machine_doc())
    out = tmp_path / "out"
    emit.write_candidate(out, cfg=cfg, model_file=MODELS / "tiny_cnn.py", env=env,
                         description="Train tiny_cnn")
    copied = sorted((out / emit.RUNTIME_NAME).glob("*.py"))
    assert [p.name for p in copied] == [p.name for p in MODULES]
    for source, copy in zip(MODULES, copied):
        assert copy.read_bytes() == source.read_bytes(), copy.name
    assert (out / emit.SCRIPT_NAME).read_bytes() == emit.SCRIPT_TEMPLATE.read_bytes()
    template = emit.SCRIPT_TEMPLATE.read_text()
    assert f'"{emit.SETTINGS_NAME}"' in template and f"from {emit.RUNTIME_NAME} import" in template
    assert json.loads((out / emit.SETTINGS_NAME).read_text())["config"] == cfg.to_dict()
