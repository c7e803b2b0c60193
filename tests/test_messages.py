"""Every command a message suggests is run as the user would paste it, and gets past the problem it fixes.

Each case makes one error happen in a fresh project copy (`kedro run` as a subprocess, as a user types it),
takes the `kedro run ...` command the message names, runs it, and checks that it succeeds (or that the run
got past that problem to the next one, which names its own fix).

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

from tests.conftest import copy_project, unused_port
from tests.test_cli import _kedro

pytestmark = pytest.mark.slow

FAST = "--params=training.num_epochs=1,training.validations_per_epoch=1"


def _suggested(output: str, *original: str) -> list[str]:
    """The arguments of the command an error message suggests: a whole ``kedro run ...``, or ``--params=...`` to
    add to the ``original`` command (merged into its own --params)."""
    if found := re.search(r"`kedro run([^`]*)`", output):
        return shlex.split(found.group(1))
    added = re.search(r"`--params=([^`]*)`", output)
    assert added, f"no suggested command in:\n{output[-2000:]}"
    given = [arg.removeprefix("--params=") for arg in original if arg.startswith("--params=")]
    others = [arg for arg in original if not arg.startswith("--params=")]
    return [*others, "--params=" + ",".join([*given, added.group(1)])]


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


def test_missing_inputs_name_the_pipelines_to_run_first(fresh):
    message = _fails(fresh, "--pipelines=evaluation")
    assert "MissingInputError" in message
    _succeeds(fresh, *_suggested(message), FAST)
    _succeeds(fresh, "--pipelines=evaluation")


def test_too_many_rejected_lines_name_the_share_that_lets_the_day_through(fresh):
    day = fresh / "data/01_raw/day_0.gz"
    import gzip

    lines = gzip.decompress(day.read_bytes()).splitlines(keepends=True)
    lines[10] = b"x" + lines[10]
    lines[20] = b"\n"
    day.write_bytes(gzip.compress(b"".join(lines)))
    message = _fails(fresh, "--pipelines=ingestion")
    assert "ingestion.max_reject_fraction" in message
    _succeeds(fresh, *_suggested(message, "--pipelines=ingestion"))


def test_scoring_rejects_name_the_scoring_setting(fresh, tmp_path):
    _succeeds(fresh, FAST)
    folder = tmp_path / "to_score"
    folder.mkdir()
    source = (fresh / "data/01_raw/day_2.gz").read_bytes()
    import gzip

    lines = gzip.decompress(source).splitlines(keepends=True)[:500]
    lines[3] = b"1\tnot a count" + lines[3][1:]
    (folder / "day_9").write_bytes(b"".join(lines))
    command = ("--pipelines=scoring", f"--params=scoring.input_dir={folder}")
    message = _fails(fresh, *command)
    assert "scoring.max_reject_fraction" in message and "ingestion.max_reject_fraction" not in message
    _succeeds(fresh, *_suggested(message, *command))


def test_a_device_that_is_not_there_names_the_parameter_to_set(fresh):
    message = _fails(fresh, "--params=training.device=cuda:99")
    assert "training.device" in message and "--params=training.device=auto" in message
    _succeeds(fresh, "--params=training.device=auto,training.num_epochs=1")


def test_one_big_file_names_the_rows_per_day_that_split_it(fresh):
    raw = fresh / "data/01_raw"
    import gzip

    text = b"".join(gzip.decompress((raw / f"day_{i}.gz").read_bytes()) for i in range(3))
    shutil.rmtree(raw)
    raw.mkdir()
    (raw / "train.txt").write_bytes(text)
    message = _fails(fresh, FAST)
    assert "ingestion.rows_per_day" in message and "validation_days" not in message
    args = [
        arg + "," + FAST.removeprefix("--params=") if arg.startswith("--params=") else arg
        for arg in _suggested(message)
    ]
    _succeeds(fresh, *args)


def test_a_pinned_metadata_version_without_its_vocabularies_names_the_pair_to_pin(fresh):
    _succeeds(fresh, FAST)
    first = sorted((fresh / "data/04_feature/feature_metadata.json").iterdir())[0].name
    _succeeds(fresh, "--pipelines=metadata", "--params=metadata.min_frequency=5")
    encoded = (fresh / "data/05_model_input/train_features/lineage.json").stat().st_mtime_ns
    message = _fails(fresh, "--pipelines=training", f"--load-versions=feature_metadata:{first}", FAST)
    assert "MismatchedVersionsError" in message and f"feature_vocabularies:{first}" in message
    assert (fresh / "data/05_model_input/train_features/lineage.json").stat().st_mtime_ns == encoded, "no work"
    _succeeds(fresh, *_suggested(message), FAST)


def test_a_damaged_day_names_the_command_that_rebuilds_it(fresh):
    _succeeds(fresh, "--pipelines=ingestion")
    [day] = (fresh / "data/02_intermediate").glob("*/day_1.parquet")
    data = bytearray(day.read_bytes())
    data[len(data) // 3] ^= 0x10
    day.write_bytes(bytes(data))
    message = _fails(fresh, "--pipelines=metadata")
    assert str(day.relative_to(fresh)) in message or str(day) in message
    _succeeds(fresh, *_suggested(message))
    _succeeds(fresh, "--pipelines=metadata")


def test_a_lineage_refusal_names_the_command_that_restores_the_day(fresh):
    _succeeds(fresh, FAST)
    [day] = (fresh / "data/02_intermediate").glob("*/day_2.parquet")
    day.unlink()
    message = _fails(fresh, "--pipelines=evaluation")
    assert "LineageError" in message
    _succeeds(fresh, *_suggested(message))
    _succeeds(fresh, "--pipelines=evaluation")


def test_torchrec_with_an_optimiser_it_lacks_on_the_cpu_names_the_one_to_use(fresh):
    pytest.importorskip("torchrec", reason="the torchrec extra is not installed")
    message = _fails(fresh, "--params=training.embedding_backend=torchrec,training.num_epochs=1")
    assert "rowwise_adagrad" in message
    assert not list((fresh / "data/02_intermediate").rglob("*.parquet")), "refused before any node"
    args = _suggested(message)
    params = next(arg for arg in args if arg.startswith("--params="))
    _succeeds(fresh, f"{params},training.num_epochs=1,training.validations_per_epoch=1")


def test_an_absent_tracking_server_suggests_running_without_tracking_and_that_runs(fresh):
    import os
    import subprocess

    port = unused_port()
    (fresh / "conf/local").mkdir(parents=True, exist_ok=True)
    (fresh / "conf/local/mlflow.yml").write_text(f"server:\n  mlflow_tracking_uri: http://127.0.0.1:{port}\n")
    message = _fails(fresh, FAST, tracking=True)
    assert "TrackingServerError" in message
    command = re.search(r"`(CRITEO_DLRM_TRACKING=off kedro run)`", message).group(1)
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1"}
    result = subprocess.run(f"{command} {FAST}", shell=True, cwd=fresh, env=env, capture_output=True, text=True,
                            timeout=600)  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "evaluation  checkpoint" in result.stdout
