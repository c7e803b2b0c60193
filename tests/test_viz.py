"""kedro viz on the project: its API lists what we expect, and headless Chromium draws the pipeline."""

import json
import re
import shutil
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import headless_dom, served, unused_port

pytestmark = pytest.mark.slow

PIPELINES = {"__default__", "ingestion", "metadata", "training", "evaluation", "scoring"}
NODES = {"convert_raw_days", "compute_feature_metadata", "encode_features", "train_dlrm", "evaluate_checkpoint"}
SCORING_NODES = {"score_new_days", "export_model"}
LAYERS = {
    "ingestion_report": "intermediate",
    "feature_metadata": "feature",
    "feature_vocabularies": "feature",
    "train_features": "model_input",
    "dlrm_checkpoint": "models",
    "evaluation_metrics": "reporting",
    "roc_curve_plot": "reporting",
}
SCORING_LAYERS = {"predictions": "model_output", "scoring_report": "model_output", "dlrm_onnx": "models"}


def _get(url: str, timeout: float = 10) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:  # noqa: S310 - loopback only
        return response.read()


@pytest.fixture(scope="module")
def viz(ran_project: Path):
    """`kedro viz run --no-browser` on the project copy; yields its base URL; stopped by process group."""
    port = unused_port()
    log = ran_project / "viz.log"

    def url() -> str:  # kedro viz moves to the next port when one is taken: read the one it chose
        found = re.search(r"http://127\.0\.0\.1:(\d+)", log.read_text())
        return f"http://127.0.0.1:{found.group(1) if found else port}"

    command = ["kedro", "viz", "run", "--no-browser", "--host", "127.0.0.1", "--port", str(port)]
    with served(command, ran_project, log, url, "/api/main", "kedro viz") as base:
        yield base


def test_api_lists_every_pipeline_node_dataset_and_layer(viz):
    main = json.loads(_get(f"{viz}/api/main"))
    assert {p["id"] for p in main["pipelines"]} == PIPELINES
    tasks = {n["name"] for n in main["nodes"] if n["type"] == "task"}
    assert tasks == NODES
    data = {n["name"]: n for n in main["nodes"] if n["type"] == "data"}
    for name, layer in LAYERS.items():
        assert data[name]["layer"] == layer, name
    default_layers = ["intermediate", "feature", "model_input", "models", "reporting"]  # raw days: ingestion.raw_dir
    assert [layer for layer in main["layers"] if layer != "model_output"] == default_layers  # scoring adds one
    scoring = json.loads(_get(f"{viz}/api/pipelines/scoring"))
    assert {n["name"] for n in scoring["nodes"] if n["type"] == "task"} == SCORING_NODES
    scoring_data = {n["name"]: n for n in scoring["nodes"] if n["type"] == "data"}
    for name, layer in SCORING_LAYERS.items():
        assert scoring_data[name]["layer"] == layer, name
    assert "model_output" in scoring["layers"]
    assert {t["id"] for t in main["tags"]} >= {"ingestion", "metadata", "training", "evaluation", "scoring"}


def test_api_previews_metadata_and_metrics(viz):
    main = json.loads(_get(f"{viz}/api/main"))
    ids = {n["name"]: n["id"] for n in main["nodes"]}
    metadata = json.loads(_get(f"{viz}/api/nodes/{ids['feature_metadata']}"))
    preview = json.loads(metadata["preview"]) if isinstance(metadata["preview"], str) else metadata["preview"]
    assert "label" in json.dumps(preview) and "SPARSE_0" in json.dumps(preview)
    metrics = json.loads(_get(f"{viz}/api/nodes/{ids['evaluation_metrics']}"))
    assert "auc" in json.dumps(metrics["preview"])
    report = json.loads(_get(f"{viz}/api/nodes/{ids['ingestion_report']}"))
    assert report["preview_type"] == "JSONPreview" and "day_0.parquet" in report["preview"]
    plot = json.loads(_get(f"{viz}/api/nodes/{ids['roc_curve_plot']}"))
    assert plot["preview"] and plot["preview_type"] == "ImagePreview"


@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_headless_chromium_draws_the_pipeline_nodes(viz, tmp_path):
    dom = headless_dom(viz, tmp_path / "profile")
    drawn = set(re.findall(r'<text class="pipeline-node__text"[^>]*>([^<]+)<', dom))
    assert NODES <= drawn, f"drawn: {sorted(drawn)}"
    assert dom.count('class="pipeline-node pipeline-node--task"') == len(NODES)


def test_kedro_viz_starts_without_third_party_deprecations(viz, ran_project):
    """Issue 45 item 5: kedro viz printed five boxed third-party warnings before its URL (kedro-viz's FastAPI
    deprecation, three of Kedro's OmegaConf resolver deprecations, MLflow's type-hint note). Its server process is
    not one this project prepares: it takes the filters from PYTHONWARNINGS, which the kedro command sets."""
    log = (ran_project / "viz.log").read_text()
    assert "ORJSONResponse is deprecated" not in log and "register_new_resolver" not in log, log[-3000:]
    assert "Add type hints" not in log and "\x1b[" not in log, log[-3000:]
