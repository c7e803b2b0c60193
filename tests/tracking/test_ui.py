"""`kedro mlflow ui` on the project's store: headless Chromium shows the bundled run in the run list."""

import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import headless_dom, served, unused_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def ui(ran_project: Path):
    """`kedro mlflow ui` as the docs start it, on a free port; yields its URL; stopped by process group."""
    port = unused_port()
    command = ["kedro", "mlflow", "ui", "--port", str(port), "--host", "127.0.0.1"]
    url = f"http://127.0.0.1:{port}"
    with served(command, ran_project, ran_project / "mlflow_ui.log", lambda: url, "/health", "kedro mlflow ui") as base:
        yield base


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_headless_chromium_lists_the_bundled_run(ui, ran_project, tmp_path):
    version = next((ran_project / "data/06_models/dlrm_checkpoint.pt").iterdir()).name
    dom = headless_dom(f"{ui}/#/experiments/1/runs", tmp_path / "profile")
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", re.sub(r"<style.*?</style>", " ", dom, flags=re.S)))
    assert "criteo_dlrm" in text and version in text, text[-2000:]
    assert "1 matching run" in text
