from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU with a working driver")


def _nvml_gpu_count() -> int:
    # NVML, not torch: importing torch here would slow every run of the suite.
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # This hook sees the whole session; touch only this directory's tests.
    here = Path(__file__).parent
    ours = [item for item in items if item.get_closest_marker("gpu") and here in Path(item.path).parents]
    if not ours or _nvml_gpu_count() > 0:
        return
    skip = pytest.mark.skip(reason="no NVIDIA GPU / NVML on this machine")
    for item in ours:
        item.add_marker(skip)


@pytest.fixture
def write_root(tmp_path: Path):
    """Build a fake root from {"/abs/path": "contents"}."""

    def build(files: dict[str, str]) -> str:
        for path, text in files.items():
            target = tmp_path / path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
        return os.fspath(tmp_path)

    return build
