"""Experiment tracking: what `kedro run` logs to the project's MLflow store, the switch, and an absent server."""

from __future__ import annotations

import errno
import http.server
import json
import os
import subprocess
import threading
import time
from importlib.util import find_spec
from pathlib import Path

import mlflow
import pytest
from kedro.framework.session import KedroSession
from kedro.framework.startup import bootstrap_project
from mlflow.tracking import MlflowClient

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.tracking.hooks import TrackingServerError, check_tracking_server
from tests.conftest import unused_port

STORE = "sqlite:///data/09_tracking/mlflow.db"


def _runs(project: Path):
    client = MlflowClient(tracking_uri=f"sqlite:///{project}/data/09_tracking/mlflow.db")
    [experiment] = [e for e in client.search_experiments() if e.name == "criteo_dlrm"]
    return client, client.search_runs([experiment.experiment_id])


@pytest.mark.slow
def test_the_bundled_run_is_tracked_with_parameters_history_metrics_artifacts_and_lineage(ran_project):
    client, runs = _runs(ran_project)
    [run] = runs
    summary_file = next((ran_project / "data/08_reporting/training_summary.json").glob("*/training_summary.json"))
    version = summary_file.parent.name
    summary = json.loads(summary_file.read_text())
    metrics_file = next((ran_project / "data/08_reporting/evaluation_metrics.json").glob("*/*.json"))
    evaluation = json.loads(metrics_file.read_text())
    assert run.info.status == "FINISHED", run.info.status
    # Named after the run's version and what it ran (issue 45 item 6: MLflow's list named runs by time alone).
    assert run.info.run_name == f"{version} ingestion+metadata+training+evaluation", run.info.run_name
    assert run.data.tags["pipelines"] == "ingestion+metadata+training+evaluation"
    # The tracking page's snippet finds the newest training run (the newest run may have scored only).
    trained = client.search_runs([run.info.experiment_id], filter_string="tags.pipelines LIKE '%training%'")
    assert [r.info.run_id for r in trained] == [run.info.run_id]
    # Every parameter a node read, flattened as --params names it.
    params = run.data.params
    assert params["training.batch_size.train"] == "256" and params["training.num_epochs"] == "1"
    assert params["metadata.min_expected_clicks"] == "3" and params["training.calibration"] == "platt"
    # The validation history, one point per validation, at its step.
    history = client.get_metric_history(run.info.run_id, "validation_log_loss")
    assert [(m.step, m.value) for m in history] == [(h["step"], h["log_loss"]) for h in summary["history"]]
    metrics = run.data.metrics
    assert metrics["kept_step"] == summary["best_step"] and metrics["processes"] == 1
    # The kept model's validation figures (what chose it), not only the history's last point.
    for name in ("log_loss", "auc", "normalized_entropy", "calibration"):
        assert metrics[f"kept_validation_{name}"] == summary["best_validation"][name]
    [kept] = client.get_metric_history(run.info.run_id, "kept_validation_auc")
    assert kept.step == summary["best_step"]
    assert metrics["test_auc"] == evaluation["model"]["auc"]
    assert metrics["test_raw_log_loss"] == evaluation["model_raw"]["log_loss"]
    assert metrics["test_expected_calibration_error"] > 0
    # Lineage tags, from the checkpoint's own record.
    tags = run.data.tags
    assert tags["checkpoint_version"] == tags["metadata_version"] == version
    assert tags["train_days"] == "day_0, day_1"
    assert tags["validation_days"] == "day_2[0:10000]" and tags["test_days"] == "day_2[10000:20000]"
    assert tags["evaluated_rows"] == "test" and tags["device"] == "cpu"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    expected = {"roc_curve_plot", "calibration_plot", "score_histogram_plot", "evaluation_metrics", "training_summary"}
    assert expected | {"ingestion_report", "feature_metadata"} <= artifacts
    [plot] = client.list_artifacts(run.info.run_id, "calibration_plot")
    assert plot.path.endswith("calibration.png") and plot.file_size > 10_000
    # mlflow.search_runs, as the docs show it, finds the same run.
    mlflow.set_tracking_uri(f"sqlite:///{ran_project}/data/09_tracking/mlflow.db")
    found = mlflow.search_runs(experiment_names=["criteo_dlrm"], filter_string=f"tags.checkpoint_version = '{version}'")
    assert list(found["run_id"]) == [run.info.run_id]


def test_an_absent_tracking_server_is_refused_at_once_and_one_that_answers_is_accepted():
    started = time.monotonic()
    with pytest.raises(TrackingServerError, match=r"does not answer.*`CRITEO_DLRM_TRACKING=off kedro run`"):
        check_tracking_server(f"http://127.0.0.1:{unused_port()}", timeout=2)
    assert time.monotonic() - started < 10

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the standard library's name
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        check_tracking_server(f"http://127.0.0.1:{server.server_port}")
        check_tracking_server(STORE)  # a local store: nothing to reach
    finally:
        server.shutdown()


@pytest.mark.slow
def test_a_run_pointed_at_an_absent_server_stops_before_any_work(project, monkeypatch):
    (project / "conf/local").mkdir(parents=True, exist_ok=True)
    (project / "conf/local/mlflow.yml").write_text(
        f"server:\n  mlflow_tracking_uri: http://127.0.0.1:{unused_port()}\n"
    )
    bootstrap_project(project)
    with pytest.raises(TrackingServerError, match="conf/local/mlflow.yml"):
        with KedroSession.create(project_path=project) as session:
            session.run(pipeline_names=["ingestion"])
    assert not list((project / "data").glob("02_intermediate/*")), "nothing was ingested"


def test_a_refused_run_opens_no_mlflow_run(project):
    bootstrap_project(project)
    # Refused by the checks before the first node (the named day exists only once ingestion has run).
    with pytest.raises(ConfigError, match=r"metadata.validation_days names \['day_9'\]"):
        with KedroSession.create(
            project_path=project, runtime_params={"metadata": {"validation_days": ["day_9"]}}
        ) as s:
            s.run()
    assert mlflow.active_run() is None, "the next session in this process would log into it"
    store = project / "data/09_tracking/mlflow.db"
    if store.exists():
        client = MlflowClient(tracking_uri=f"sqlite:///{store}")
        ids = [e.experiment_id for e in client.search_experiments()]
        assert not client.search_runs(ids), "no run left RUNNING in the store"


@pytest.mark.slow
def test_an_evaluation_only_run_names_its_checkpoint_and_rows_and_a_refused_one_leaves_no_run(project):
    bootstrap_project(project)
    fast = {"training": {"num_epochs": 1, "validations_per_epoch": 1}}
    with KedroSession.create(project_path=project, runtime_params=fast) as session:
        session.run(pipeline_names=["ingestion", "metadata", "training"])
    with KedroSession.create(project_path=project) as session:
        session.run(pipeline_names=["evaluation"])
    client, runs = _runs(project)
    [evaluation] = [run for run in runs if "evaluated_rows" in run.data.tags]
    [checkpoint] = (project / "data/06_models/dlrm_checkpoint.pt").iterdir()
    tags = evaluation.data.tags
    assert tags["checkpoint_version"] == checkpoint.name and tags["metadata_version"] == checkpoint.name
    assert tags["evaluated_days"] == "day_2[10000:20000]"
    [day] = (project / "data/02_intermediate").glob("*/day_2.parquet")
    day.unlink()  # the evaluation node refuses its checkpoint's rows before any work
    with pytest.raises(Exception, match="LineageError|no longer exists"):
        with KedroSession.create(project_path=project) as session:
            session.run(pipeline_names=["evaluation"])
    assert mlflow.active_run() is None
    _, after = _runs(project)
    assert sorted(r.info.run_id for r in after) == sorted(r.info.run_id for r in runs), "the refused run is not kept"


@pytest.mark.slow
def test_tracking_off_is_one_setting_and_the_run_never_touches_mlflow(project):
    env = {**os.environ, "CRITEO_DLRM_TRACKING": "off", "KEDRO_DISABLE_TELEMETRY": "1"}
    result = subprocess.run(
        ["kedro", "run", "--pipelines=ingestion"], cwd=project, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Mlflow run" not in result.stdout + result.stderr
    assert not (project / "data/09_tracking/mlflow.db").exists()
    assert list((project / "data").glob("02_intermediate/*/day_0.parquet")), "the run itself ran"


@pytest.mark.slow
@pytest.mark.parametrize(
    "backend",
    [
        {},
        pytest.param(
            {
                "embedding_backend": "torchrec",
                "embedding_optimizer": "rowwise_adagrad",
                "embedding_learning_rate": 0.05,
            },
            marks=pytest.mark.skipif(find_spec("torchrec") is None, reason="the torchrec extra is not installed"),
            id="torchrec",
        ),
    ],
    ids=lambda backend: "ddp" if not backend else "torchrec",
)
def test_a_two_process_run_is_logged_once(project, backend):
    bootstrap_project(project)
    training = {"num_epochs": 1, "distributed": {"nproc_per_node": 2}, **backend}
    with KedroSession.create(project_path=project, runtime_params={"training": training}) as session:
        session.run(pipeline_names=["ingestion", "metadata", "training"])
    client, runs = _runs(project)
    [run] = runs
    assert run.data.metrics["processes"] == 2
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "validation_auc")]
    assert steps and len(steps) == len(set(steps)), "each validation once, from the launching process"
    assert run.data.params["training.distributed.nproc_per_node"] == "2"
    assert run.data.params["training.embedding_backend"] == backend.get("embedding_backend", "torch")


def test_a_read_only_tracking_store_is_refused_before_the_run_with_the_switch(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from criteo_dlrm.common import storage
    from criteo_dlrm.common.storage import NotWritableError
    from criteo_dlrm.tracking.hooks import TrackingHooks

    store = tmp_path / "tracking" / "mlflow.db"
    real = storage.create_exclusive

    def read_only(path):  # a read-only mount (root ignores chmod, so the mount is simulated)
        if "tracking" in str(path):
            raise OSError(errno.EROFS, "Read-only file system")
        return real(path)

    monkeypatch.setattr(storage, "create_exclusive", read_only)
    context = SimpleNamespace(
        project_path=tmp_path, config_loader=_Loader({"server": {"mlflow_tracking_uri": f"sqlite:///{store}"}})
    )
    with pytest.raises(
        NotWritableError,
        match=r"tracking is not writable \(Read-only file system\).*MLflow's tracking store.*`CRITEO_DLRM_TRACKING=off kedro run`",
    ):
        TrackingHooks().after_context_created(context)


class _Loader(dict):
    """A config loader answering ``loader["mlflow"]``."""

    def __init__(self, mlflow: dict):
        super().__init__(mlflow=mlflow)
        self.config_patterns: dict = {}


def test_the_time_to_a_reached_target_auc_is_logged_at_its_step(tmp_path):
    """Issue 47 item 3: MLPerf's figure of merit beside the run's other training figures."""
    from criteo_dlrm.engine.trained.reports import TrainingSummary
    from criteo_dlrm.tracking.hooks import _log

    validation = {"rows": 100, "ctr": 0.25, "auc": 0.76, "log_loss": 0.5, "normalized_entropy": 0.9,
                  "calibration": 1.0, "accuracy": 0.7}  # fmt: skip
    summary = {"history": [{"step": 20, "epoch": 0, **validation}], "best_validation": validation, "best_step": 20, "steps": 20,
               "samples_per_second": 10.0, "processes": 1, "device": "cpu", "stopped_early": False,
               "target": {"auc": 0.75, "reached": True, "step": 20, "epoch": 0, "validation_auc": 0.76,
                          "train_seconds": 12.5, "wall_seconds": 15.0}}  # fmt: skip
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path}/mlflow.db")
    try:
        client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
        experiment = client.create_experiment("target")  # its own: another test's active experiment is elsewhere
        with mlflow.start_run(experiment_id=experiment) as run:
            _log(TrainingSummary.from_dict(summary).tracked())
        logged = {name: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, name)]
                  for name in ("time_to_target_train_seconds", "time_to_target_wall_seconds")}  # fmt: skip
    finally:
        mlflow.set_tracking_uri(None)
    assert logged == {"time_to_target_train_seconds": [(20, 12.5)], "time_to_target_wall_seconds": [(20, 15.0)]}


def test_a_tracking_server_answering_404_is_refused_before_the_run():
    import http.server
    import threading

    from criteo_dlrm.tracking.hooks import TrackingServerError, check_tracking_server
    from tests.conftest import unused_port

    port = unused_port()
    server = http.server.HTTPServer(("127.0.0.1", port), http.server.SimpleHTTPRequestHandler)
    thread = threading.Thread(target=server.handle_request, daemon=True)
    thread.start()
    try:
        with pytest.raises(TrackingServerError, match=r"answered HTTP 404 .*not an MLflow tracking server"):
            check_tracking_server(f"http://127.0.0.1:{port}/nothing-here")
    finally:
        server.server_close()


@pytest.mark.parametrize("how", ["SIGINT", "SIGTERM"])
def test_a_run_ended_by_ctrl_c_or_sigterm_is_killed_in_mlflow(tmp_path, how):
    """Issue 62 item 15: a Ctrl-C'd run showed FINISHED in MLflow (its exit handler's status), a SIGTERM'd one
    (a scheduler's) RUNNING forever."""
    import signal
    import sys

    from tests.conftest import copy_project
    from tests.engine.training.test_distributed import _saved_step

    project = copy_project(tmp_path / "project")
    params = "--params=training.num_epochs=100,training.checkpoint_every_steps=20,training.early_stopping.patience=1000"
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRITEO_DLRM_")} | {"KEDRO_DISABLE_TELEMETRY": "1"}
    run = subprocess.Popen([sys.executable, "-m", "kedro", "run", params], cwd=project, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while _saved_step(project / "data/06_models/in_progress") < 20:  # training, its run open in MLflow
            assert run.poll() is None and time.monotonic() < deadline, "training ended before a checkpoint"
            time.sleep(0.05)
        os.killpg(run.pid, getattr(signal, how))
        output = run.communicate(timeout=120)[0]
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode != 0, output[-3000:]
    _, runs = _runs(project)
    assert [r.info.status for r in runs] == ["KILLED"], output[-3000:]
