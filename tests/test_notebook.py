"""The exploration notebook runs end to end on a project after `kedro run`, as Jupyter runs it: its kernel in
``notebooks/`` (where JupyterLab starts it), through ``jupyter nbconvert --execute``."""

import shutil
import subprocess
import sys

import nbformat
import pytest

from tests.conftest import PROJECT_ROOT

pytestmark = pytest.mark.slow


def test_exploration_notebook_executes_from_its_own_folder_on_the_bundled_sample(ran_project, tmp_path):
    folder = ran_project / "notebooks"
    folder.mkdir(exist_ok=True)
    shutil.copy(PROJECT_ROOT / "notebooks" / "explore.ipynb", folder / "explore.ipynb")
    executed = tmp_path / "executed.ipynb"
    result = subprocess.run(
        [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "explore.ipynb",
         "--output", str(executed), "--ExecutePreprocessor.timeout=300"],
        cwd=folder, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    notebook = nbformat.read(executed, as_version=4)
    outputs = {i: cell.get("outputs", []) for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"}
    assert not [o for cell in outputs.values() for o in cell if o.get("output_type") == "error"]
    text = "\n".join(
        str(o.get("data", {}).get("text/plain", "")) + o.get("text", "") for cell in outputs.values() for o in cell
    )
    assert "training rows 40,000" in text
    # The first screen says what the project says (issue 45 item 5): no tqdm widget warning, the project's logging.
    assert "IProgress not found" not in text and "No typed parameter requirements" not in text, text[:3000]
    assert "SPARSE_25" in text and "auc" in text
    images = sum("image/png" in o.get("data", {}) for cell in outputs.values() for o in cell)
    assert images >= 3, "metadata, training curve and comparison plots"
