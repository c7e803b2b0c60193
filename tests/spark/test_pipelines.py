"""`kedro run` with preprocessing.engine=spark writes what the local engine writes, and trains and evaluates to the
same metrics (bit for bit: the same rows in the same order, one training thread in both runs)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.conftest import copy_project
from tests.spark.conftest import needs_spark

pytestmark = pytest.mark.slow

FAST = "training.num_epochs=1,training.validations_per_epoch=2,training.num_threads=1"
SPARK_YML = "spark.master: local[2]\nspark.sql.shuffle.partitions: 4\nspark.ui.enabled: false\n"


def _latest(folder: Path) -> Path:
    version = sorted(folder.iterdir())[-1]
    return version / folder.name


def test_the_whole_job_on_spark_equals_the_local_one(tmp_path):
    needs_spark()
    projects = {engine: copy_project(tmp_path / engine) for engine in ("local", "spark")}
    # Both read one raw folder outside both projects: a day records its raw path (relative to the project only when
    # inside it) and time, which name its Parquet folder, so the two runs' intermediate files are byte-identical.
    raw = tmp_path / "raw"
    shutil.copytree(projects["local"] / "data" / "01_raw", raw)  # copy2 keeps the times
    (projects["spark"] / "conf" / "local" / "spark.yml").write_text(
        SPARK_YML
    )  # read by the project's PreprocessingEngineHooks
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1", "CRITEO_DLRM_TRACKING": "off"}
    runs = {
        engine: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kedro",
                "run",
                f"--params={FAST},preprocessing.engine={engine},ingestion.raw_dir={raw}",
            ],
            cwd=project,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for engine, project in projects.items()
    }
    outputs = {engine: run.communicate(timeout=600)[0] for engine, run in runs.items()}
    for engine, run in runs.items():
        assert run.returncode == 0, outputs[engine][-3000:]
    assert "_convert_task: 3 Spark tasks on local[2]" in outputs["spark"]  # spark.yml's master, one task per file
    assert "feature metadata counted by Spark on local[2]" in outputs["spark"]
    assert "Spark tasks" not in outputs["local"]

    local, spark = projects["local"] / "data", projects["spark"] / "data"
    days = sorted((local / "02_intermediate").rglob("day_*.parquet"))
    assert len(days) == 3
    for day in days:
        theirs = spark / day.relative_to(local)
        assert pq.read_table(theirs).equals(pq.read_table(day))
        assert theirs.read_bytes() == day.read_bytes()  # the same file: values, schema, metadata, fingerprint
        assert Path(f"{theirs}.fingerprint").read_text() == Path(f"{day}.fingerprint").read_text()

    metadata = [
        json.loads(_latest(data / "04_feature" / "feature_metadata.json").read_text()) for data in (local, spark)
    ]
    assert metadata[0] == metadata[1]
    vocabularies = [np.load(_latest(data / "04_feature" / "feature_vocabularies.npz")) for data in (local, spark)]
    assert sorted(vocabularies[0].files) == sorted(vocabularies[1].files)
    assert all(np.array_equal(vocabularies[0][name], vocabularies[1][name]) for name in vocabularies[0].files)

    for split in ("train_features", "validation_features"):
        for name in ("labels.npy", "dense.npy", "sparse.npy", "chunk_digests.npy", "index_maxima.json", "layout.json"):
            mine, theirs = local / "05_model_input" / split / name, spark / "05_model_input" / split / name
            assert mine.read_bytes() == theirs.read_bytes(), (split, name)
        digests = [
            json.loads((data / "05_model_input" / split / "digests.json").read_text()) for data in (local, spark)
        ]
        for recorded in digests:
            recorded["files"].pop("lineage.json")  # names the run's metadata version
        assert digests[0] == digests[1]
        lineage = [
            json.loads((data / "05_model_input" / split / "lineage.json").read_text()) for data in (local, spark)
        ]
        assert lineage[0]["days"] == lineage[1]["days"]  # the same days' fingerprints (versions are each run's own)

    metrics = [
        json.loads(_latest(data / "08_reporting" / "evaluation_metrics.json").read_text()) for data in (local, spark)
    ]
    assert metrics[0]["vocabulary_sha256"] == metrics[1]["vocabulary_sha256"]
    for name in ("auc", "log_loss", "normalized_entropy", "calibration"):
        assert metrics[1]["model"][name] == metrics[0]["model"][name], name
