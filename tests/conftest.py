"""Shared fixtures: seeded synthetic Criteo data and throwaway copies of the Kedro project."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

PROJECT_ROOT = Path(__file__).resolve().parents[1]
REAL_DATA = PROJECT_ROOT.parent / "shared" / "data" / "criteo_real"


def naive_parse_line(line: str) -> tuple:
    """An independent reference: Python's own int() on each field of one raw line."""
    fields = line.rstrip("\r\n").split("\t")
    assert len(fields) == 40
    label = int(fields[0])
    dense = [int(value) if value else None for value in fields[1:14]]
    sparse = [int(value, 16) if value else None for value in fields[14:]]
    return (label, *dense, *sparse)


@pytest.fixture
def real_data() -> Path:
    if not REAL_DATA.is_dir():
        pytest.skip(f"real Criteo sample not present at {REAL_DATA}")
    return REAL_DATA


def copy_project(destination: Path, raw_source: Path | None = None) -> Path:
    """A copy of the project's configuration and raw data in ``destination`` (the package stays installed)."""
    destination.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", ".telemetry"):
        shutil.copy(PROJECT_ROOT / name, destination / name)
    shutil.copytree(PROJECT_ROOT / "conf", destination / "conf", ignore=shutil.ignore_patterns("credentials.yml"))
    (destination / "src").mkdir()  # Kedro wants it; the package itself is installed
    raw = destination / "data" / "01_raw"
    shutil.copytree(raw_source or PROJECT_ROOT / "data" / "01_raw", raw, ignore=shutil.ignore_patterns(".gitkeep"))
    return destination


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary copy of the project, as the working directory, so runs never write into the repository."""
    path = copy_project(tmp_path / "project")
    monkeypatch.chdir(path)
    return path
