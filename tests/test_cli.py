"""``kedro run`` as a user types it (a subprocess, output piped): errors, noise, list parameters, summary."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
import torch

from criteo_dlrm.cli import split_params
from tests.conftest import PROJECT_ROOT, copy_project


def _kedro(project: Path, *args: str, tracking: bool = True) -> subprocess.CompletedProcess:
    """``kedro run`` with ``args``, as a user types it; ``tracking=False``: with CRITEO_DLRM_TRACKING=off (about
    4 s less per run, for tests whose subject is not what MLflow records)."""
    # The caller's own CRITEO_DLRM_* settings left out: each test sets what it needs.
    env = {k: v for k, v in os.environ.items() if not k.startswith("CRITEO_DLRM_")} | {"KEDRO_DISABLE_TELEMETRY": "1"}
    env.pop("COLUMNS", None)
    if not tracking:
        env["CRITEO_DLRM_TRACKING"] = "off"
    return subprocess.run(
        [sys.executable, "-m", "kedro", "run", *args], cwd=project, env=env, capture_output=True, text=True, timeout=600
    )


def _parse(value: str) -> dict:
    return split_params(click.Context(click.Command("run")), None, value)


def test_list_parameters_keep_their_commas():
    assert _parse("training.dense_mlp.hidden_layer_sizes=[128,64],training.seed=3") == {
        "training": {"dense_mlp": {"hidden_layer_sizes": [128, 64]}, "seed": 3}
    }
    assert _parse("metadata.vocabulary_size_overrides={SPARSE_2: 10, SPARSE_3: 20}") == {
        "metadata": {"vocabulary_size_overrides": {"SPARSE_2": 10, "SPARSE_3": 20}}
    }
    assert _parse("") == {}
    with pytest.raises(click.UsageError, match="must be key=value"):
        _parse("training.seed")


@pytest.mark.slow
def test_user_errors_end_with_the_message_and_the_fix(tmp_path):
    project = copy_project(tmp_path / "project")
    missing = _kedro(project, "--pipelines=training")
    assert missing.returncode == 1
    last = missing.stderr.strip().splitlines()[-2:]
    assert last[0].startswith("MissingInputError: This run needs feature_metadata, feature_vocabularies")
    assert "Run `kedro run --pipelines=ingestion,metadata` first" in last[0]
    assert last[1] == "(Full traceback: add --verbose.)"
    assert "Traceback" not in missing.stdout + missing.stderr
    assert len((missing.stdout + missing.stderr).splitlines()) < 20

    no_folder = _kedro(project, "--params=ingestion.raw_dir=/nowhere")
    assert no_folder.returncode == 1
    assert (
        no_folder.stderr.strip()
        .splitlines()[-2]
        .startswith("IngestionError: ingestion.raw_dir: the folder /nowhere does not exist")
    )

    verbose = _kedro(project, "--pipelines=training", "--verbose")
    assert verbose.returncode == 1 and "Traceback" in verbose.stdout + verbose.stderr


def test_a_refusal_inside_a_node_is_said_once_last_without_kedro_s_resume_hint_or_mlflow_s_lines(tmp_path):
    import gzip

    project = copy_project(tmp_path / "project")
    one = tmp_path / "one"
    one.mkdir()
    (one / "train.txt").write_bytes(gzip.decompress((project / "data/01_raw/day_0.gz").read_bytes()))
    result = _kedro(project, f"--params=ingestion.raw_dir={one}")  # tracked: kedro-mlflow's lines too
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert output.count("the only ingested day, train, would validate") == 1, output[-3000:]
    assert "--from-nodes" not in output and "was closed because of an error" not in output
    assert result.stderr.strip().splitlines()[-2].startswith("ConfigError: metadata: the only ingested day")


def test_a_parameter_typo_is_refused_before_mlflow_opens_its_store(tmp_path):
    project = copy_project(tmp_path / "project")
    result = _kedro(project, "--params=training.num_epoch=1")
    assert result.returncode == 1 and "did you mean training.num_epochs?" in result.stderr
    assert not (project / "data/09_tracking/mlflow.db").exists(), "the tracking store was never opened"
    output = result.stdout + result.stderr
    assert "Add type hints" not in output and "\x1b[" not in output, "no MLflow warning in raw colour codes"
    assert "is relative" not in output, "no misleading line about a relative tracking URI"


def _stages(stdout: str) -> dict[str, str]:
    """The last summary block's stages, each its first line's values with its continuation lines (a line past 100
    columns wraps under the values) joined by a space: ``{"ingestion": "3 days (reused), ...", ...}``."""
    stages: dict[str, str] = {}
    name = ""
    for line in stdout[stdout.rindex("\nRun ") + 1 :].splitlines()[1:]:
        if line.startswith("  ") and line[2] != " ":
            name, _, value = line[2:].partition(" ")
            stages[name] = value.strip()
        elif name:
            stages[name] += " " + line.strip()
    return stages


def _readme_metrics() -> dict[str, float]:
    """The evaluation lines of the summary block the README quotes under Quick start."""
    readme = (PROJECT_ROOT / "README.md").read_text()
    line = re.search(r"^  evaluation  .*\n.*$", readme, re.MULTILINE).group(0)
    oracle = re.search(r"oracle AUC ([0-9.]+)", readme).group(1)
    values = dict(re.findall(r"(AUC|log loss|NE|calibration) ([0-9.]+)", line))
    return {**{key: float(value) for key, value in values.items()}, "oracle AUC": float(oracle)}


@pytest.mark.slow
def test_kedro_run_ends_with_one_summary_block_matching_the_readme(tmp_path):
    project = copy_project(tmp_path / "project")
    result = _kedro(project)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "register_new_resolver" not in output and "No typed parameter" not in output
    # Paths in log lines are the project's, as the user types them (the encoded rows' lines were absolute).
    assert "data/05_model_input/train_features: 40,000 encoded rows written" in output
    assert f"{project}/data/05_model_input" not in output
    block = result.stdout[result.stdout.rindex("\nRun ") + 1 :].rstrip().splitlines()
    assert [line.split()[0] for line in block[1:6]] == ["ingestion", "day_0,", "metadata", "training", "evaluation"]
    assert block[2] == "              day_0, day_1 train; day_2 validate (first 50%) and test (last 50%)"
    assert all(len(line) <= 100 for line in block), "short lines, never wrapped"
    checkpoint = sorted((project / "data/06_models/dlrm_checkpoint.pt").iterdir())[-1].name
    assert block[5] == f"  evaluation  checkpoint {checkpoint}, 10,000 test rows of day_2:", (
        "the summary names the checkpoint it evaluated and the rows (how many) it evaluated on"
    )
    evaluation = dict(re.findall(r"(AUC|log loss|NE|calibration) ([0-9.]+)", block[6]))
    quoted = _readme_metrics()
    assert float(evaluation["AUC"]) == pytest.approx(quoted["AUC"], abs=2e-3), "README's quoted kedro run output"
    assert float(evaluation["log loss"]) == pytest.approx(quoted["log loss"], abs=2e-3)
    assert float(evaluation["calibration"]) == pytest.approx(quoted["calibration"], abs=5e-3)
    assert block[7].lstrip().startswith("platt calibration: ECE "), "the calibration applied, and the raw output"
    assert float(re.search(r"oracle AUC ([0-9.]+)", block[8]).group(1)) == quoted["oracle AUC"]
    # The precision it trained in, as the README's pasted run says: conf/base's, the same on every CPU (with
    # precision: auto it would follow the CPU, and the README would be true on some machines only).
    readme_training = re.search(r"^  training    .*$", (PROJECT_ROOT / "README.md").read_text(), re.MULTILINE).group(0)
    trained_in = r", (fp32|bf16), \d+ threads?, [0-9,]+ samples/s$"
    assert re.search(trained_in, block[4]).group(1) == re.search(trained_in, readme_training).group(1) == "fp32"

    # A list parameter on the command line, as the README's parameters section shows it.
    listed = _kedro(
        project, "--pipelines=training", "--params=training.dense_mlp.hidden_layer_sizes=[32,8],training.max_steps=5"
    )
    assert listed.returncode == 0, (listed.stdout + listed.stderr)[-3000:]
    newest = sorted((project / "data/06_models/dlrm_checkpoint.pt").iterdir())[-1]
    checkpoint = torch.load(newest / "dlrm_checkpoint.pt", weights_only=True)
    assert checkpoint["model_config"]["dense_mlp"]["hidden_layer_sizes"] == [32, 8]


def test_a_catalog_file_with_a_python_tag_is_refused_in_a_few_lines_naming_it(tmp_path):
    """A !!python/name tag in conf/local/catalog.yml ended in a traceback of 170 lines that did not name it."""
    project = copy_project(tmp_path / "project")
    (project / "conf/local/catalog.yml").write_text("foo: !!python/name:os.system\n")
    result = _kedro(project, tracking=False)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and len(output.strip().splitlines()) < 10, output[-3000:]
    assert "conf/local/catalog.yml, line 1, column 6: could not determine a constructor" in output
    assert "Traceback" not in output


def test_an_unknown_environment_is_refused_in_two_lines_naming_the_ones_there(tmp_path):
    """--env mlpref ended in 290 lines whose last was an MLflow store error."""
    project = copy_project(tmp_path / "project")
    result = _kedro(project, "--env", "mlpref")
    output = (result.stdout + result.stderr).strip()
    assert result.returncode == 1 and len(output.splitlines()) <= 3, output[-3000:]
    assert "No environment 'mlpref' (did you mean mlperf?)" in output
    assert "The environments: local, mlperf, torchrec_dlrm." in output and "Traceback" not in output


@pytest.mark.slow
def test_ctrl_c_in_training_then_the_same_command_resumes_reusing_what_was_made(tmp_path):
    """Ctrl-C, then the same `kedro run`, threw the training away: the metadata was counted again into a new
    version, so the rows were encoded again and the resume fingerprint changed; the run said only "Aborted!"."""
    import signal
    import time

    from tests.engine.training.test_distributed import _saved_step

    project = copy_project(tmp_path / "project")
    # 500 steps: the interrupted run is still training when its checkpoint at step 20 is seen (about 9 s later at the
    # bundled sample's 14,000 samples/s), and the resumed one trains the rest (3 epochs more) in seconds.
    params = ("--params=training.num_epochs=100,training.max_steps=500,training.checkpoint_every_steps=20,"
              "training.early_stopping.patience=1000")  # fmt: skip
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1", "CRITEO_DLRM_TRACKING": "off"}
    run = subprocess.Popen([sys.executable, "-m", "kedro", "run", params], cwd=project, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    in_progress = project / "data/06_models/in_progress"
    deadline = time.monotonic() + 300
    while _saved_step(in_progress) < 20:  # a checkpoint past the first (step 0)
        assert run.poll() is None and time.monotonic() < deadline, "training ended before a checkpoint"
        time.sleep(0.05)
    os.killpg(run.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends: the whole foreground group
    interrupted = run.communicate(timeout=120)[0]
    assert run.returncode != 0
    [state] = in_progress.glob("dlrm_*.pt")
    assert "training interrupted: its state as of the last in-progress checkpoint" in interrupted
    assert f"is in {state.relative_to(project)}" in interrupted or f"is in {state}" in interrupted
    assert f"Run the same command to continue from it: `kedro run {params}`" in interrupted

    again = _kedro(project, params, tracking=False)
    output = again.stdout + again.stderr
    assert again.returncode == 0, output[-3000:]
    assert "feature metadata: reused version" in output
    assert "already encoded from the same metadata version and days; reused" in output
    resumed = re.search(r"resumed from .*dlrm_\w+\.pt at step (\d+)", output)
    assert resumed and int(resumed.group(1)) >= 20, output[-3000:]
    assert "training finished at step 500" in output
    assert not list(in_progress.rglob("*.pt")) and not list(in_progress.glob(".*.lock")), "nothing left behind"
    stages = _stages(again.stdout)  # the summary says what was reused
    assert stages["ingestion"].startswith("3 days (reused), 60,000 rows"), stages
    assert stages["metadata"].startswith(
        f"reused version {sorted(os.listdir(project / 'data/04_feature/feature_metadata.json'))[0]}: "
    )
    assert stages["training"].startswith(f"resumed at step {int(resumed.group(1)):,}, 500 steps"), stages


def test_kedro_run_help_ends_with_the_project_s_pipelines_and_where_its_parameters_are(tmp_path):
    """Issue 45 item 6: `kedro run --help` listed no pipeline or parameter."""
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1"}
    result = subprocess.run([sys.executable, "-m", "kedro", "run", "--help"], cwd=PROJECT_ROOT, env=env,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "This project's pipelines: ingestion, metadata, training, evaluation, scoring;" in result.stdout
    assert "docs/parameters.md" in result.stdout and "--load-versions=dlrm_checkpoint:<version>" in result.stdout
    for page in ("docs/parameters.md", "docs/scoring.md"):
        assert (PROJECT_ROOT / page).is_file(), page


@pytest.mark.slow
def test_kill_9_of_kedro_run_while_it_encodes_in_workers_leaves_no_process_behind(tmp_path):
    """Issue 50 item 3: a kedro process killed by SIGKILL (a scheduler's memory limit) left its encoding workers,
    the forkserver and its resource tracker running, holding memory every later stage of the job counted."""
    import signal
    import time
    import uuid

    from criteo_dlrm.data.synthetic import write_days
    from tests.common.test_parallel import _kill_marked, _left_after, _marked

    raw = tmp_path / "raw"
    write_days(raw, 3, 300_000, compress=False)  # uncompressed: ingestion is quick, encoding lasts seconds
    project = copy_project(tmp_path / "project", raw_source=raw)
    mark = uuid.uuid4().hex
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1", "CRITEO_DLRM_TRACKING": "off", "CRITEO_DLRM_TEST_MARK": mark}
    run = subprocess.Popen([sys.executable, "-m", "kedro", "run", "--params=training.encoding_workers=2"],
                           cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        # kedro, the forkserver, its resource tracker and two encoding workers (ingestion and metadata run in
        # the kedro process at this size)
        while len(_marked(mark)) < 5:
            assert run.poll() is None and time.monotonic() < deadline, "the encoding workers never started"
            time.sleep(0.02)
        run.send_signal(signal.SIGKILL)
        run.wait()
        assert list((project / "data/05_model_input").glob(".train_features.*.partial")), "killed while encoding"
        assert _left_after(mark) == [], "every process of the run ends with it"
    finally:
        _kill_marked(mark)
        if run.poll() is None:
            run.kill()


def test_kill_9_of_kedro_run_as_it_starts_its_training_processes_ends_them_at_once(tmp_path):
    """Issue 62 item 9: a kedro process killed just as it started two training processes left both running for 300 s
    or more (importing torch, then waiting for the rendezvous store of a process that was gone). Each now asks
    the kernel first thing to end it with its parent."""
    import signal
    import time
    import uuid

    from tests.common.test_parallel import _kill_marked, _left_after, _marked

    project = copy_project(tmp_path / "project")
    mark = uuid.uuid4().hex
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1", "CRITEO_DLRM_TRACKING": "off", "CRITEO_DLRM_TEST_MARK": mark}
    run = subprocess.Popen([sys.executable, "-m", "kedro", "run", "--params=training.distributed.nproc_per_node=2"],
                           cwd=project, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

    def training_processes() -> list[int]:
        found = []
        for pid in _marked(mark):
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if b"criteo_dlrm.engine.training.distributed" in command or b"spawn_main" in command:
                found.append(pid)
        return found

    try:
        deadline = time.monotonic() + 300
        while not training_processes():
            assert run.poll() is None and time.monotonic() < deadline, "the training processes never started"
            time.sleep(0.01)
        run.send_signal(signal.SIGKILL)
        run.wait()
        assert _left_after(mark, seconds=15.0) == [], "the training processes end with the run"
    finally:
        _kill_marked(mark)
        if run.poll() is None:
            run.kill()


def test_a_rerun_with_nothing_changed_reuses_the_finished_training_and_says_so_in_place_or_in_a_copy(tmp_path):
    """Issue 45 item 2: a second `kedro run` reused the days, metadata and encoded rows but trained again from
    step 0. Now the finished run is reused when its settings and rows are this run's (a changed setting, or
    training.resume=false, trains). Issue 62 item 12: a copy of a finished project (its files' times kept: cp -a,
    rsync -a) converted every day again and retrained, the raw folder's absolute path being part of each day's
    identity. Paths inside the project count relative to it."""
    project = copy_project(tmp_path / "project")
    params = "--params=training.max_steps=30"
    first = _kedro(project, params, tracking=False)
    assert first.returncode == 0, first.stderr[-3000:]
    moved = tmp_path / "elsewhere" / "copy"
    shutil.copytree(project, moved, symlinks=True)  # copy2: the files' modification times kept
    [trained] = re.findall(r"run folder data/08_reporting/tensorboard/(\S+)", first.stderr + first.stdout)
    auc = re.compile(r"AUC (0\.\d+), log loss (0\.\d+)")
    for where in (project, moved):
        again = _kedro(where, params, tracking=False)
        output = again.stdout + again.stderr
        assert again.returncode == 0, output[-3000:]
        assert f"training: reused the finished run of version {trained}" in output, where
        assert "training on cpu" not in output, "nothing trained"
        stages = _stages(again.stdout)
        assert stages["ingestion"].startswith("3 days (reused), 60,000 rows"), stages
        assert stages["metadata"].startswith("reused version "), stages
        assert stages["training"].startswith(f"reused version {trained}: 30 steps"), stages
        assert auc.findall(first.stdout)[-1] == auc.findall(again.stdout)[-1], "the same model evaluated"
    changed = _kedro(project, "--params=training.max_steps=30,training.resume=false", "--pipelines=training",
                     tracking=False)  # fmt: skip
    assert changed.returncode == 0 and "training on cpu" in changed.stdout + changed.stderr


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"training:\n  seed: 1\n  seed: 2\n", r"line 3, column 3: the key 'seed' is given twice \(first on line 2\)"),
        (b"training:\n  seed: [1\n", r"parameters.yml, line 3, column 1: expected ','"),
        (b"training:\n  seed: 1 # caf\xe9\n", r"parameters.yml, line 2: byte 0xe9 is not UTF-8"),
        (
            b"training:\n  seed: !!python/name:os.system\n",
            r"line 2, column 9: could not determine a constructor .*tags are not read",
        ),
        (
            b"a: &a [x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\nc: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\n"
            b"d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\ne: [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\n",
            r"parameters.yml: its aliases \(\*name\) expand to more than 10,000 values",
        ),
    ],
)
def test_a_configuration_file_kedro_cannot_read_is_refused_naming_file_and_line(tmp_path, content, problem):
    from criteo_dlrm.cli import check_conf_files
    from criteo_dlrm.common.errors import ConfigError

    (tmp_path / "base").mkdir()
    (tmp_path / "local").mkdir()
    (tmp_path / "base" / "parameters.yml").write_text("training:\n  seed: 0\n")
    check_conf_files(tmp_path, None)
    (tmp_path / "local" / "parameters.yml").write_bytes(content)
    with pytest.raises(ConfigError, match=problem):
        check_conf_files(tmp_path, None)


def test_a_yaml_merge_key_is_read_as_yaml_reads_it(tmp_path):
    """A standard merge key (<<: *base) was refused as 'could not determine a constructor'."""
    from criteo_dlrm.cli import check_conf_files, versioned_datasets

    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "catalog.yml").write_text(
        "_versioned: &versioned\n  type: criteo_dlrm.datasets.JSONDataset\n  versioned: true\n"
        "a:\n  <<: *versioned\n  filepath: data/a.json\nb:\n  <<: *versioned\n  versioned: false\n  filepath: b\n"
    )
    check_conf_files(tmp_path, None)
    assert versioned_datasets(tmp_path) == {"_versioned": "_versioned", "a": "data/a.json"}
