import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.common.memory import MemoryRoom
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.engine import memory
from criteo_dlrm.engine.memory import check_table_memory, embedding_bytes, run_memory_bytes
from criteo_dlrm.models.dlrm import DLRM
from tests.common.test_memory import _own_v1_group
from tests.conftest import copy_project

SIZES = [100_000] * 26  # 32 values a row (the default): 333 MB of tables, 1.0 GB with SparseAdam's state


def _dense_values(config: TrainingConfig) -> int:
    model = DLRM(config.model_config(SIZES))
    return sum(p.numel() for name, p in model.named_parameters() if not name.startswith("embeddings."))


def test_a_cpu_run_is_counted_from_its_parts_each_process_s_replica_included():
    tables = embedding_bytes(SIZES, [32] * 26, "sparse_adam")
    assert tables == 4 * 3 * 100_000 * 26 * 32
    one = TrainingConfig.from_dict({})
    parts = run_memory_bytes(one, one.model_config(SIZES), tables, train_rows=10_000, validation_rows=5_000)
    assert parts["tables and their optimiser state (1 process(es))"] == tables
    assert parts["dense layers (weights, gradients, Adam's moments)"] == 16 * _dense_values(one)
    assert parts["the loader's windows"] == 2 * 10_000 * memory.WINDOW_BYTES_PER_ROW  # prefetching: two windows
    assert parts["the validation's predictions and metrics (5,000 rows)"] == 5_000 * memory.VALIDATION_BYTES_PER_ROW
    assert parts["training's own work (threads, kernels' buffers, TensorBoard, plots)"] == memory.TRAINING_WORK_BYTES
    assert not any("further process" in name for name in parts)
    # A whole window of rows when the training rows are not known, one without prefetching.
    whole = run_memory_bytes(one, one.model_config(SIZES), tables)
    assert whole["the loader's windows"] == 2 * 16 * 65_536 * memory.WINDOW_BYTES_PER_ROW
    alone = TrainingConfig.from_dict({"prefetch_batches": 0})
    assert run_memory_bytes(alone, alone.model_config(SIZES), tables, train_rows=10_000)["the loader's windows"] == (
        10_000 * memory.WINDOW_BYTES_PER_ROW
    )
    # A batch's work grows with its rows; the validation batch is bounded by the rows validated.
    big = TrainingConfig.from_dict({"batch_size": {"train": 2 * one.batch_size.train}})
    batch = "a training batch (activations, the tables' gradients)"
    assert run_memory_bytes(big, big.model_config(SIZES), tables)[batch] == pytest.approx(2 * parts[batch], rel=1e-6)
    few = run_memory_bytes(one, one.model_config(SIZES), tables, validation_rows=10)
    assert few["a validation batch's activations"] < parts["a validation batch's activations"]


def test_each_further_process_holds_a_replica_and_its_own_start():
    """(Slow by the tier rule, which reads the setting's name as a run of two processes: it starts none.)"""
    tables = embedding_bytes(SIZES, [32] * 26, "sparse_adam")
    two = TrainingConfig.from_dict({"distributed": {"nproc_per_node": 2}})
    doubled = run_memory_bytes(two, two.model_config(SIZES), tables, train_rows=10_000, validation_rows=5_000)
    assert doubled["tables and their optimiser state (2 process(es))"] == 2 * tables
    assert doubled["dense layers (weights, gradients, Adam's moments)"] == 2 * 16 * _dense_values(two)
    assert doubled["1 further process(es)"] == memory.PROCESS_OVERHEAD_BYTES


def _counted(config: TrainingConfig, own: int) -> int:
    return own + sum(
        run_memory_bytes(config, config.model_config(SIZES), embedding_bytes(SIZES, [32] * 26, "sparse_adam")).values()
    )


def test_tables_that_do_not_fit_the_job_s_memory_limit_are_refused_with_each_part_and_the_group(monkeypatch):
    where = "the memory group of Slurm job 7 (limit 1.50 GB)"
    config = TrainingConfig.from_dict({})
    monkeypatch.setattr(memory, "memory_room", lambda: MemoryRoom(1_500_000_000, where))
    monkeypatch.setattr(memory, "own_memory_bytes", lambda: 0)
    with pytest.raises(ConfigError) as refused:
        check_table_memory(config, SIZES, torch.device("cpu"))
    message = str(refused.value)
    needed = _counted(config, 0)
    assert f"need {needed / 1e9:,.1f} GB in all (this process now (Python, torch, Kedro, MLflow) 0.00 GB" in message
    assert "tables and their optimiser state (1 process(es)) 1.00 GB" in message
    assert "the loader's windows 0.34 GB" in message  # 2 windows of 1,048,576 rows
    assert f"more than {where} (1.5 GB left, this process included)" in message
    assert "metadata.max_vocabulary_size" in message and "embedding_backend: torchrec" in message
    assert "kedro run --params=training.memory_check=false" in message  # the setting that trains anyway
    assert refused.value.fixes[0].params == {
        "training.memory_check": False
    }  # the Fix the CLI merges into the user's own command line
    monkeypatch.setattr(memory, "memory_room", lambda: MemoryRoom(needed, where))
    check_table_memory(config, SIZES, torch.device("cpu"))


def test_with_the_check_off_a_run_that_does_not_fit_is_logged_with_the_count_and_goes_on(monkeypatch):
    from loguru import logger

    config = TrainingConfig.from_dict({"memory_check": False})
    monkeypatch.setattr(memory, "memory_room", lambda: MemoryRoom(100_000_000, "the test's room"))
    monkeypatch.setattr(memory, "own_memory_bytes", lambda: 0)
    logged = []
    sink = logger.add(logged.append, level="WARNING", format="{message}")
    try:
        check_table_memory(config, SIZES, torch.device("cpu"))
    finally:
        logger.remove(sink)
    assert len(logged) == 1
    assert "tables and their optimiser state (1 process(es)) 1.00 GB" in logged[0]
    assert "training.memory_check is false: training anyway" in logged[0]


def test_what_this_process_already_holds_is_counted_once(monkeypatch):
    """This process (Python, torch, Kedro, MLflow) is a part of the count and already out of the room: it is given
    back to the room, so counted once (counted twice, a 0.93 GB group refused the bundled sample's run)."""
    config = TrainingConfig.from_dict({})
    where = "the memory group of Slurm job 7"
    rest = _counted(config, 0)
    monkeypatch.setattr(memory, "memory_room", lambda: MemoryRoom(rest, where))  # what is left besides this process
    monkeypatch.setattr(memory, "own_memory_bytes", lambda: 600_000_000)  # in use by this process
    check_table_memory(config, SIZES, torch.device("cpu"))
    monkeypatch.setattr(memory, "memory_room", lambda: MemoryRoom(rest - 1, where))
    with pytest.raises(ConfigError, match=r"this process now \(Python, torch, Kedro, MLflow\) 0\.60 GB"):
        check_table_memory(config, SIZES, torch.device("cpu"))


def test_this_process_s_own_memory_is_what_it_holds_alone():
    before = memory.own_memory_bytes()
    block = bytearray(200_000_000)
    block[::4096] = b"x" * len(block[::4096])  # touched: resident
    assert 190_000_000 < memory.own_memory_bytes() - before < 260_000_000
    del block


def _in_group(limit: int, project: Path, *args: str) -> subprocess.CompletedProcess:
    """``kedro run`` with ``args`` in ``project``, inside a new memory cgroup of ``limit`` bytes (page cache counted)."""
    group = _own_v1_group() / f"criteo_dlrm_test_{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit))
        env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1", "CRITEO_DLRM_TRACKING": "off"}
        command = f'echo $$ > {group}/cgroup.procs && exec "{sys.executable}" -m kedro run {" ".join(args)}'
        return subprocess.run(["sh", "-c", command], cwd=project, env=env, capture_output=True, text=True, timeout=600)
    finally:
        group.rmdir()


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or _own_v1_group() is None, reason="needs root and cgroup v1's memory")
def test_inside_a_memory_cgroup_a_run_counted_too_large_is_refused_before_any_work_and_its_fix_trains(tmp_path):
    """The modulus-hashed tables (1.0 GB with SparseAdam's state) and what training holds besides are counted
    2.0-2.1 GB: refused in a 1.9 GB group before ingestion. The run itself needs 1.6-1.75 GB (killed by the kernel in
    a 1.6 GB group, completed in 1.75 GB: AMD EPYC, 2 cores), so the command the message suggests (the user's own,
    with ``training.memory_check=false`` merged in) trains in the same group."""
    project = copy_project(tmp_path / "project")
    params = "--params=metadata.use_modulus_hash=true,metadata.modulus_hash_size=100000,training.max_steps=20"
    refused = _in_group(1_900_000_000, project, params)
    assert refused.returncode != 0
    counted = re.search(r"need (\d+\.\d) GB in all \(this process now", refused.stderr)
    assert counted and 1.9 < float(counted[1]) < 2.3, refused.stderr[-3000:]  # 2.0-2.1: this process's own weight
    assert "more than the memory cgroup" in refused.stderr and "criteo_dlrm_test_" in refused.stderr
    assert not (project / "data/02_intermediate").exists() or not any((project / "data/02_intermediate").iterdir())
    suggested = re.search(r"`kedro run (--params=[^`]+)` trains anyway", refused.stderr)
    assert suggested and suggested[1] == f"{params},training.memory_check=false"
    trained = _in_group(1_900_000_000, project, suggested[1])
    assert trained.returncode == 0, trained.stderr[-3000:]
    output = trained.stdout + trained.stderr
    assert "training finished at step 20" in output and "training.memory_check is false: training anyway" in output


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or _own_v1_group() is None, reason="needs root and cgroup v1's memory")
def test_the_bundled_sample_s_whole_job_completes_in_a_1_gb_memory_cgroup(tmp_path):
    """The job's largest stage peaks at 0.55-1.16 GB of the group (page cache included, reclaimed under the limit);
    the parts counted for the sample's tables fit 1 GB, and the whole ``kedro run`` completes there."""
    project = copy_project(tmp_path / "project")
    ran = _in_group(1_000_000_000, project)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "evaluation  checkpoint" in ran.stdout  # the summary's evaluation of the trained checkpoint
    assert list((project / "data/08_reporting/evaluation_metrics.json").iterdir())


def test_on_a_gpu_the_count_is_the_tables_the_dense_layers_and_a_batch_s_work(monkeypatch):
    """Tables that fit a GPU's free memory alone are refused when the dense layers and the batches' work do not
    fit beside them (the count was the tables alone), each part named with its size."""
    config = TrainingConfig.from_dict({"batch_size": {"train": 4096, "validation": 65536}})
    model_config = config.model_config(SIZES)
    tables = embedding_bytes(SIZES, [32] * 26, "sparse_adam")
    parts = memory.gpu_memory_bytes(config, model_config, tables)
    dense = sum(p.numel() for name, p in DLRM(model_config).named_parameters() if not name.startswith("embeddings."))
    assert parts["dense layers (weights, gradients, Adam's moments)"] == 16 * dense
    bigger = memory.gpu_memory_bytes(
        TrainingConfig.from_dict({"batch_size": {"train": 8192, "validation": 131072}}), model_config, tables
    )
    for name in ("a training batch (activations, their gradients, the tables' gradients)",
                 "a validation batch's activations"):  # fmt: skip
        assert parts[name] > 0 and bigger[name] == pytest.approx(2 * parts[name], rel=1e-6), name
    needed = sum(parts.values())
    assert needed > tables + 100_000_000  # the validation batch alone: 65,536 rows of activations
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (tables + 50_000_000, 150_000_000_000))
    with pytest.raises(ConfigError) as refused:
        check_table_memory(config, SIZES, torch.device("cuda", 0))
    message = str(refused.value)
    assert f"{needed / 1e9:,.1f} GB on each GPU" in message and "NVIDIA H200's free memory" in message
    assert "a validation batch's activations" in message and "dense layers" in message
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (needed + 1, 150_000_000_000))
    check_table_memory(config, SIZES, torch.device("cuda", 0))


def test_on_a_gpu_the_validation_s_predictions_and_the_allocator_s_margin_are_counted(monkeypatch):
    """On a GPU the validation's predictions and metrics stay there: a run whose tables, model and batches fit is
    refused when MLPerf's 89M validation rows (2.9 GB) would not fit beside them, or the allocator's margin."""
    config = TrainingConfig.from_dict({})
    model_config = config.model_config(SIZES)
    tables = embedding_bytes(SIZES, [32] * 26, "sparse_adam")
    alone = memory.gpu_memory_bytes(config, model_config, tables)
    parts = memory.gpu_memory_bytes(config, model_config, tables, validation_rows=89_137_319)
    validation = "the validation's predictions and metrics (89,137,319 rows)"
    assert parts[validation] == memory.VALIDATION_BYTES_PER_ROW * 89_137_319
    counted = sum(size for name, size in parts.items() if name != "the caching allocator's margin")
    assert parts["the caching allocator's margin"] == int(0.10 * counted)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (sum(alone.values()) + 1, 150_000_000_000))
    check_table_memory(config, SIZES, torch.device("cuda", 0))  # no validation rows: it fits
    with pytest.raises(ConfigError) as refused:
        check_table_memory(config, SIZES, torch.device("cuda", 0), validation_rows=89_137_319)
    assert validation in str(refused.value) and "the caching allocator's margin" in str(refused.value)
