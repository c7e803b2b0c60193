"""Every benchmark runs, at its smallest size, on the project as it is: a default or an API change cannot break
one unseen (three were: two built models with sizes the new defaults refuse, one compared with the former
table layout). Their figures are not checked here; the benchmarks page records them."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import PROJECT_ROOT
from tests.spark.conftest import needs_spark

SMALLEST = {
    "calibration": ["--train-rows", "10000", "--validation-rows", "10000", "--ctrs", "0.25"],
    "encoding": ["--rows", "10000"],
    "ingestion": ["--rows", "10000"],
    "integrity": ["--rows", "10000", "--repeats", "1"],
    "scoring": ["--rows", "10000"],
    "scale": ["--loader-rows", "100000", "--batches", "3", "--pipeline-rows", "40000", "--steps", "3"],
    "distributed": ["--processes", "1", "--steps", "3", "--rows", "10000"],
    "sharding": ["--processes", "1", "--steps", "3", "--rows", "10000", "--skip-budget"],
    "preprocessing": ["--days", "1", "--rows-per-day", "10000", "--workers", "1", "--distinct", "10000", "--repeats", "1"],
    "step_profile": ["--steps", "2"],
    "training": ["--rows", "10000", "--steps", "3", "--skip-compile", "--predecessor-steps", "1", "--max-table-rows", "2000"],
    "threads": ["--steps", "5", "--repeats", "1", "--loads", "idle"],
    "recipes": ["--rows", "10000", "--batch", "256", "--steps", "2", "--max-table-rows", "2000"],
    "spark": ["--days", "1", "--rows-per-day", "5000", "--repeats", "1"],
    "model_state": ["--table-gb", "0.01", "--runs", "torch:1", "torchrec:2", "--metric-rows", "100000"],
    "gpu": ["--batches", "256", "--steps", "2", "--rows", "10000", "--skip-compile"],
    "memory_limit": ["--rows", "100000"],
    "job_memory": ["--stages", "ingestion", "--limits-mb"],
}  # fmt: skip
NEEDS_CGROUPS = ("memory_limit", "job_memory")  # each runs stages inside memory groups of its own
# Not here: gpu_smoke.py, whose CPU dry run hung once in the full suite (600 s, cause not found; alone it takes 12 s);
# quality.py, which trains to convergence on 100,000 rows at least (minutes on 2 cores); it builds its
# models through TrainingConfig.from_dict, as training does.


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SMALLEST))
def test_every_benchmark_runs_at_its_smallest_size(name, tmp_path):
    if name == "gpu" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")  # a GPU test: the skip guard allows it
    if name == "spark":
        needs_spark()
    if name in NEEDS_CGROUPS and (os.geteuid() != 0 or not Path("/sys/fs/cgroup/memory").is_dir()):
        pytest.skip(
            "needs root and cgroup v1's memory controller"
        )  # CI has both: it never skips there  # skips without the spark extra or Java, as every Spark test does
    result = subprocess.run(
        [sys.executable, f"benchmarks/{name}.py", *SMALLEST[name]],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "|" in result.stdout, "it printed its table"


def test_every_quality_study_setting_builds_its_model_through_the_yaml_names(monkeypatch, tmp_path):
    """quality.py trains too long to run here: each of its settings is built instead, through the YAML's names
    (an unknown or misspelt name, or sizes the defaults refuse, fail here, not minutes into a study)."""
    monkeypatch.syspath_prepend(str(PROJECT_ROOT / "benchmarks"))
    import quality

    import training

    studies = [quality.CURVE_SETTINGS, *quality.REAL_DLRM_GRID]
    studies += [{**quality.CURVE_SETTINGS, "training.interaction": i} for i in quality.INTERACTIONS]
    studies += [{**quality.CURVE_SETTINGS, **change} for change in quality.REMEDIES.values()]
    for options in studies:
        assert {key.split(".")[0] for key in options} <= {"training", "metadata", "initial_ctr", "shared_missing_row"}
        config = quality.training_config(options, tmp_path)
        assert config.model_config([3] * 26).table_sizes == [3] * 26
        quality.metadata_config(options)
    assert quality.training_config({"training.batch_size.train": 8192}, tmp_path).batch_size.train == 8192
    assert quality.metadata_config({"metadata.min_frequency": 7}).min_frequency == 7
    for spec in [training.KAGGLE_LIKE, *training.CONFIGURATIONS.values()]:
        training.spec_config(spec)
