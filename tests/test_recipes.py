"""The recipes users compare against as Kedro environments (issue 47): `kedro run --env mlperf` and
`--env torchrec_dlrm`, shrunk by --params to this machine (model widths, batch, steps, one process), end to end
on the bundled sample, as a user types them."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from criteo_dlrm.engine.trained.checkpoint import load_checkpoint
from tests.conftest import PROJECT_ROOT, copy_project

pytest.importorskip("torchrec", reason="the recipes shard their tables with TorchRec: the torchrec extra")
pytestmark = pytest.mark.slow

# The recipe's widths, batches and processes cut to a 2-core CPU; everything else is the environment's.
SHRUNK = (
    "training.distributed.nproc_per_node=1,training.batch_size.train=256,training.batch_size.validation=4096,"
    "training.max_steps=20,training.validate_every_steps=10,training.log_every_steps=2,"
    "training.sparse_embedding_sizes=16,training.dense_mlp.hidden_layer_sizes=[32],training.dense_mlp.output_size=16,"
    "training.prediction_hidden_sizes=[32]"
)


def _kedro(project: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1", "CRITEO_DLRM_TRACKING": "off"}
    run = subprocess.run([sys.executable, "-m", "kedro", "run", *args], cwd=project, env=env, capture_output=True,
                         text=True, timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


def _page_command(env: str) -> list[str]:
    """The shrunk command docs/recipes.md gives for ``--env env``: the arguments after ``kedro run``, as a shell
    splits them (the test runs what the page shows)."""
    page = (PROJECT_ROOT / "docs" / "recipes.md").read_text()
    [line] = [line for line in page.splitlines() if line.startswith(f'kedro run --env {env} --params="')]
    return shlex.split(line)[2:]


def _latest_checkpoint(project: Path) -> dict:
    [version] = sorted((project / "data/06_models/dlrm_checkpoint.pt").iterdir())[-1:]
    return load_checkpoint(version / "dlrm_checkpoint.pt")


def _environment(name: str) -> dict:
    return yaml.safe_load((PROJECT_ROOT / "conf" / name / "parameters.yml").read_text())


def test_the_mlperf_environment_trains_multi_hot_dcn_with_adagrad_to_its_target_then_scores_and_exports(tmp_path):
    project = copy_project(tmp_path / "project")
    recipe = _environment("mlperf")["training"]
    command = _page_command("mlperf")
    assert command == ["--env", "mlperf", f"--params={SHRUNK},training.dcn.low_rank=16,training.target_auc=0.52"]
    run = _kedro(project, *command)
    output = run.stdout + run.stderr
    assert "214 lookups a row (multi-hot)" in output and "multi-hot: 214 lookups a row" in output
    assert "target AUC 0.52 reached at step 10" in output and "(target AUC 0.52 at step 10: " in output
    assert "is_fx_tracing" not in output and "broadcast_buffers" not in output, "torch's notes on TorchRec's calls"
    checkpoint = _latest_checkpoint(project)
    assert checkpoint["model_config"]["multi_hot_sizes"] == recipe["multi_hot_sizes"]
    assert checkpoint["model_config"]["interaction"] == "dcn" and checkpoint["model_config"]["dcn"]["init"] == (
        "xavier_normal"
    )
    [dense] = checkpoint["dense_param_groups"]  # the dense optimiser's own settings, as it ran
    assert dense["lr"] == recipe["learning_rate"] == 0.004 and dense["eps"] == recipe["adagrad_eps"] == 1e-8
    assert "initial_accumulator_value" in dense, "torch.optim.Adagrad's"
    assert checkpoint["step"] == 10, "stopped at the first validation at its target"
    assert checkpoint["encoder"]["dense_offset"].tolist() == [2] * 13, "log(x + 3), the reference's dense transform"

    scored = _kedro(project, "--env", "mlperf", "--pipelines=scoring")
    assert "scored 60,000 rows" in scored.stdout + scored.stderr
    assert "ONNX" in scored.stdout and "onnxruntime max |difference|" in scored.stdout


def test_the_torchrec_example_environment_trains_with_sgd_and_its_step_change_of_the_rates(tmp_path):
    project = copy_project(tmp_path / "project")
    recipe = _environment("torchrec_dlrm")["training"]
    assert (recipe["learning_rate"], recipe["step_decay"]) == (15.0, {"at": 0.8, "learning_rate": 0.2})
    # SGD at 15.0 trains a 16-wide model on 256-row steps to NaN (at step 14): the page's command cuts the rates
    # tenfold with the model, the recipe's ratio kept.
    rates = "training.learning_rate=1.5,training.embedding_learning_rate=1.5,training.step_decay.learning_rate=0.02"
    command = _page_command("torchrec_dlrm")
    assert command == ["--env", "torchrec_dlrm", f"--params={SHRUNK},{rates}"]
    _kedro(project, *command)  # a NaN loss fails the run
    checkpoint = _latest_checkpoint(project)
    assert checkpoint["model_config"]["interaction"] == "dot" and checkpoint["model_config"]["multi_hot_sizes"] is None
    [dense] = checkpoint["dense_param_groups"]
    assert "momentum" in dense and "eps" not in dense, "torch.optim.SGD's"
    [run_dir] = (project / "data/08_reporting/tensorboard").iterdir()
    events = EventAccumulator(str(run_dir)).Reload()
    for name in ("train/learning_rate", "train/embedding_learning_rate"):
        logged = {event.step: event.value for event in events.Scalars(name)}
        # 20 steps: the 16th and earlier at 1.5, from the 17th (80% of the run) on at 0.02.
        assert logged[16] == pytest.approx(1.5) and logged[18] == pytest.approx(0.02), (name, logged)
