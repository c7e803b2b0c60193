"""Every command a message suggests is run as the user would paste it, and gets past the problem it fixes.

Each case makes one error happen in a fresh project copy, or in a copy of a project the whole job ran in once
(``ran``: the cases that start from a finished run share that one run), with `kedro run` as a subprocess, as a
user types it, takes the `kedro run ...` command the message names, runs it, and checks that it succeeds (or
that the run got past that problem to the next one, which names its own fix).

The runs are made with experiment tracking off (``CRITEO_DLRM_TRACKING=off``, 4 s less each): no message here
comes from it, and the tracked run is tested in ``tests/tracking`` and ``tests/test_cli.py``. The case of an
absent tracking server runs with it on.
"""

from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from tests.conftest import copy_project, made_once, unused_port
from tests.test_cli import _kedro

pytestmark = pytest.mark.slow

FAST = "--params=training.num_epochs=1,training.validations_per_epoch=1"


def _suggested(output: str) -> list[str]:
    """The arguments of the ``kedro run ...`` an error message suggests, to run exactly as printed."""
    found = re.search(r"`kedro run([^`]*)`", output)
    assert found, f"no suggested command in:\n{output[-2000:]}"
    return shlex.split(found.group(1))


def _keeps(suggestion: list[str], *original: str) -> None:
    """The suggestion is the user's own command with the fix merged in: every --params name, and the
    --load-versions and --env, of ``original`` are still there (the fix may replace a value or the pipelines)."""
    from criteo_dlrm.cli import split_params
    from criteo_dlrm.common.commands import dotted

    def names(arguments) -> set[str]:
        given = [arg.removeprefix("--params=") for arg in arguments if arg.startswith("--params=")]
        return {name for value in given for name in dotted(split_params(None, None, value))}

    assert names(original) <= names(suggestion), (original, suggestion)
    for arg in original:
        if arg.startswith(("--load-versions=", "--env=")):
            assert arg in suggestion, (arg, suggestion)


def _fails(project: Path, *args: str, tracking: bool = False) -> str:
    result = _kedro(project, *args, tracking=tracking)
    assert result.returncode == 1, (result.stdout + result.stderr)[-3000:]
    last = result.stderr.strip().splitlines()
    assert "Traceback" not in result.stdout + result.stderr
    return "\n".join(last[-3:])


def _succeeds(project: Path, *args: str) -> str:
    result = _kedro(project, *args, tracking=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    return result.stdout


@pytest.fixture
def fresh(tmp_path) -> Path:
    return copy_project(tmp_path / "project")


@pytest.fixture(scope="module")
def ran_once(tmp_path_factory, worker_id) -> Path:
    """A project the whole job ran in once (``FAST``): shared by the cases that start from a finished run, each of
    which copies it, on every xdist worker (the first to need it runs it, under a lock the others wait on)."""

    def run(folder: Path) -> None:
        _succeeds(copy_project(folder / "project"), FAST)

    return made_once(tmp_path_factory, worker_id, "messages_ran", run) / "project"


@pytest.fixture
def ran(ran_once, tmp_path) -> Path:
    """This case's own copy of ``ran_once`` (every path the project writes is relative to it)."""
    return Path(shutil.copytree(ran_once, tmp_path / "project", symlinks=True))


def test_missing_inputs_name_the_pipelines_to_run_first(fresh):
    message = _fails(fresh, "--pipelines=evaluation", FAST)
    assert "MissingInputError" in message
    suggestion = _suggested(message)
    _keeps(suggestion, FAST)
    _succeeds(fresh, *suggestion)
    _succeeds(fresh, "--pipelines=evaluation")


def test_too_many_rejected_lines_name_the_share_that_lets_the_day_through(fresh):
    day = fresh / "data/01_raw/day_0.gz"
    import gzip

    lines = gzip.decompress(day.read_bytes()).splitlines(keepends=True)
    lines[10] = b"x" + lines[10]
    lines[20] = b"\n"
    day.write_bytes(gzip.compress(b"".join(lines)))
    command = ("--pipelines=ingestion", "--params=ingestion.block_size_mb=2")
    message = _fails(fresh, *command)
    assert "ingestion.max_reject_fraction" in message
    suggestion = _suggested(message)
    _keeps(suggestion, *command)
    assert "--pipelines=ingestion" in suggestion
    _succeeds(fresh, *suggestion)


def test_scoring_rejects_name_the_scoring_setting(ran, tmp_path):
    folder = tmp_path / "to_score"
    folder.mkdir()
    source = (ran / "data/01_raw/day_2.gz").read_bytes()
    import gzip

    lines = gzip.decompress(source).splitlines(keepends=True)[:500]
    lines[3] = b"1\tnot a count" + lines[3][1:]
    (folder / "day_9").write_bytes(b"".join(lines))
    command = ("--pipelines=scoring", f"--params=scoring.input_dir={folder}")
    message = _fails(ran, *command)
    assert "scoring.max_reject_fraction" in message and "ingestion.max_reject_fraction" not in message
    suggestion = _suggested(message)
    _keeps(suggestion, *command)
    assert "--pipelines=scoring" in suggestion
    assert "scoring     checkpoint" in _succeeds(ran, *suggestion)


def test_a_device_that_is_not_there_names_the_parameter_to_set(fresh):
    message = _fails(fresh, FAST + ",training.device=cuda:99")
    assert "training.device" in message
    suggestion = _suggested(message)
    assert "training.device=auto" in suggestion[-1]
    _keeps(suggestion, FAST)
    _succeeds(fresh, *suggestion)


def test_one_big_file_names_the_rows_per_day_that_split_it_and_keeps_the_user_s_folder(fresh, tmp_path):
    import gzip

    raw = fresh / "data/01_raw"
    kaggle = tmp_path / "kaggle"
    kaggle.mkdir()
    text = b"".join(gzip.decompress((raw / f"day_{i}.gz").read_bytes()) for i in range(2))
    (kaggle / "train.txt").write_bytes(text)  # 40,000 rows, not the bundled sample's 60,000
    command = (FAST + f",ingestion.raw_dir={kaggle}",)
    message = _fails(fresh, *command)
    assert "ingestion.rows_per_day" in message and "validation_days" not in message
    suggestion = _suggested(message)
    _keeps(suggestion, *command)
    output = _succeeds(fresh, *suggestion)
    assert "ingestion   7 days (converted), 40,000 rows" in output, "the user's file, split as the message says"

    # A split day removed: the restore command a pinned evaluation suggests splits the file as it was split (it
    # left rows_per_day out, converting one unsplit day, and with it added the 6 remaining parts were "reused"
    # as a 6-day split), and the evaluation then passes.
    checkpoint = sorted((fresh / "data/06_models/dlrm_checkpoint.pt").iterdir())[-1].name
    [last] = fresh.glob("data/02_intermediate/kaggle-*/train_0006.parquet")
    last.unlink()
    pinned = ("--pipelines=evaluation", f"--load-versions=dlrm_checkpoint:{checkpoint}")
    message = _fails(fresh, *pinned)
    assert "train_0006: " in message and "no longer exists" in message
    restore = _suggested(message)
    assert restore[0] == "--pipelines=ingestion" and "ingestion.rows_per_day=5715" in " ".join(restore), restore
    restored = _succeeds(fresh, *restore)
    assert "ingestion   7 days (converted), 40,000 rows" in restored, "the split made again, not 6 days reused"
    _succeeds(fresh, *pinned)


def test_a_pinned_metadata_version_without_its_vocabularies_names_the_pair_to_pin(ran):
    first = sorted((ran / "data/04_feature/feature_metadata.json").iterdir())[0].name
    _succeeds(ran, "--pipelines=metadata", "--params=metadata.min_frequency=5")
    encoded = (ran / "data/05_model_input/train_features/lineage.json").stat().st_mtime_ns
    command = ("--pipelines=training", f"--load-versions=feature_metadata:{first}", FAST)
    message = _fails(ran, *command)
    assert "MismatchedVersionsError" in message and f"feature_vocabularies:{first}" in message
    assert (ran / "data/05_model_input/train_features/lineage.json").stat().st_mtime_ns == encoded, "no work"
    suggestion = _suggested(message)
    _keeps(suggestion, "--pipelines=training", FAST)
    _succeeds(ran, *suggestion)


def test_a_damaged_day_names_the_command_that_rebuilds_it(ran):
    [day] = (ran / "data/02_intermediate").glob("*/day_1.parquet")
    data = bytearray(day.read_bytes())
    data[len(data) // 3] ^= 0x10
    day.write_bytes(bytes(data))
    command = ("--pipelines=metadata", "--params=metadata.min_frequency=4")
    message = _fails(ran, *command)
    assert str(day.relative_to(ran)) in message or str(day) in message
    suggestion = _suggested(message)
    _keeps(suggestion, *command)
    _succeeds(ran, *suggestion)
    _succeeds(ran, *command)


def test_a_lineage_refusal_names_the_command_that_restores_the_day(ran):
    [day] = (ran / "data/02_intermediate").glob("*/day_2.parquet")
    day.unlink()
    command = ("--pipelines=evaluation", "--params=evaluation.device=cpu")
    message = _fails(ran, *command)
    assert "LineageError" in message
    suggestion = _suggested(message)
    _keeps(suggestion, *command)
    _succeeds(ran, *suggestion)
    _succeeds(ran, *command)


def test_torchrec_with_an_optimiser_it_lacks_on_the_cpu_names_the_one_to_use(fresh):
    pytest.importorskip("torchrec", reason="the torchrec extra is not installed")
    command = (FAST + ",training.embedding_backend=torchrec",)
    message = _fails(fresh, *command)
    assert "rowwise_adagrad" in message
    assert not list((fresh / "data/02_intermediate").rglob("*.parquet")), "refused before any node"
    suggestion = _suggested(message)
    _keeps(suggestion, *command)
    assert "training.embedding_learning_rate=0.05" in suggestion[-1], "docs/torchrec.md's rate for rowwise_adagrad"
    _succeeds(fresh, *suggestion)


def test_an_absent_tracking_server_suggests_running_without_tracking_and_that_runs(fresh):
    import os
    import subprocess

    port = unused_port()
    (fresh / "conf/local").mkdir(parents=True, exist_ok=True)
    (fresh / "conf/local/mlflow.yml").write_text(f"server:\n  mlflow_tracking_uri: http://127.0.0.1:{port}\n")
    message = _fails(fresh, FAST, tracking=True)
    assert "TrackingServerError" in message
    command = re.search(r"`(CRITEO_DLRM_TRACKING=off kedro run[^`]*)`", message).group(1)
    _keeps(shlex.split(command)[3:], FAST)
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1"}
    result = subprocess.run(command, shell=True, cwd=fresh, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "evaluation  checkpoint" in result.stdout


def test_from_a_folder_inside_the_project_a_run_and_its_suggested_command_use_the_project_s_files(ran):
    inside = ran / "notebooks"
    inside.mkdir(exist_ok=True)
    assert "AUC" in _succeeds(inside, "--pipelines=evaluation"), "the lineage's paths are the project's"
    [day] = ran.glob("data/02_intermediate/*/day_2.parquet")
    day.unlink()
    message = _fails(inside, "--pipelines=evaluation")
    assert "day_2" in message and "no longer exists" in message
    _succeeds(inside, *_suggested(message))
    assert day.exists(), "restored where the project keeps it"
    _succeeds(inside, "--pipelines=evaluation")
    assert not (inside / "data").exists(), "no second copy of the data in the folder the command ran from"


def test_a_run_evaluates_the_checkpoint_it_trained_whatever_the_other_versions_are_dated(ran):
    """Issue 46 item 1: with a checkpoint version dated later than now (a clock set back, or versions copied from
    a machine whose clock is ahead), `--pipelines=training,evaluation` trained a new model and evaluated the old
    one, exit 0; evaluating alone read the misdated one as the newest without a word."""
    folder = ran / "data/06_models/dlrm_checkpoint.pt"
    [trained] = folder.iterdir()
    future = "2099-01-01T00.00.00.000Z"
    trained.rename(folder / future)
    output = _succeeds(ran, "--pipelines=training,evaluation", FAST)
    run = re.search(r"^Run (\S+):$", output, re.MULTILINE).group(1)
    assert f"evaluation  checkpoint {run}, " in output, "the checkpoint this run trained"
    message = _fails(ran, "--pipelines=evaluation")
    assert f"dlrm_checkpoint's newest version, {future}, is dated after this run began" in message
    suggestion = _suggested(message)
    assert f"--load-versions=dlrm_checkpoint:{future}" in suggestion
    assert f"evaluation  checkpoint {future}, " in _succeeds(ran, *suggestion)
