"""The exploration notebook runs end to end on a project after `kedro run`."""

import nbformat
import pytest
from nbclient import NotebookClient

from tests.conftest import PROJECT_ROOT

pytestmark = pytest.mark.slow


def test_exploration_notebook_executes_on_the_bundled_sample(ran_project):
    notebook = nbformat.read(PROJECT_ROOT / "notebooks" / "explore.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(ran_project)}}
    ).execute()
    outputs = {i: cell.get("outputs", []) for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"}
    assert not [o for cell in outputs.values() for o in cell if o.get("output_type") == "error"]
    text = "\n".join(
        str(o.get("data", {}).get("text/plain", "")) + o.get("text", "") for cell in outputs.values() for o in cell
    )
    assert "training rows 40,000" in text
    assert "SPARSE_25" in text and "auc" in text
    images = sum("image/png" in o.get("data", {}) for cell in outputs.values() for o in cell)
    assert images >= 3, "metadata, training curve and comparison plots"
