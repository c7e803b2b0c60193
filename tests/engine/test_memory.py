import os
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


def test_a_run_is_counted_as_every_process_s_replica_and_what_the_run_holds_besides():
    tables = embedding_bytes(SIZES, [32] * 26, "sparse_adam")
    assert tables == 4 * 3 * 100_000 * 26 * 32
    one = TrainingConfig.from_dict({})
    two = TrainingConfig.from_dict({"distributed": {"nproc_per_node": 2}})
    assert run_memory_bytes(one, tables) == tables + RUN_OVERHEAD_BYTES
    assert run_memory_bytes(two, tables) == 2 * tables + RUN_OVERHEAD_BYTES + memory.PROCESS_OVERHEAD_BYTES


def test_tables_that_do_not_fit_the_job_s_cgroup_are_refused_with_the_numbers_and_the_group(monkeypatch):
    where = "the memory cgroup /sys/fs/cgroup/memory/slurm/job_7 (limit 2.00 GB)"
    monkeypatch.setattr(memory, "memory_room", lambda: MemoryRoom(2_000_000_000, where))
    monkeypatch.setattr(memory, "own_memory_bytes", lambda: 0)
    with pytest.raises(ConfigError) as refused:
        check_table_memory(TrainingConfig.from_dict({}), SIZES, torch.device("cpu"))
    message = str(refused.value)
    assert "1.0 GB in each of 1 process(es)" in message and "2.5 GB for the run besides: 3.5 GB" in message
    assert f"more than {where} (2.0 GB left, this process included)" in message
    assert "metadata.max_vocabulary_size" in message and "embedding_backend: torchrec" in message
    monkeypatch.setattr(memory, "memory_room", lambda: MemoryRoom(3_600_000_000, where))
    check_table_memory(TrainingConfig.from_dict({}), SIZES, torch.device("cpu"))


def test_what_this_process_already_holds_is_counted_once(monkeypatch):
    """The run's allowance (RUN_OVERHEAD_BYTES) includes this process (Python, torch, Kedro, MLflow), which the
    room already excludes: counted twice, a 0.93 GB group refused the bundled sample's run, whose stages peak at
    0.78 GB."""
    where = "the memory cgroup /sys/fs/cgroup/memory/slurm/job_7 (limit 3.60 GB)"
    monkeypatch.setattr(memory, "memory_room", lambda: MemoryRoom(3_000_000_000, where))  # 0.6 GB in use
    monkeypatch.setattr(memory, "own_memory_bytes", lambda: 600_000_000)  # by this process
    check_table_memory(TrainingConfig.from_dict({}), SIZES, torch.device("cpu"))  # 3.5 GB of 3.6
    monkeypatch.setattr(memory, "own_memory_bytes", lambda: 400_000_000)  # 0.2 GB held by other processes
    with pytest.raises(ConfigError, match=r"\(3\.4 GB left, this process included\)"):
        check_table_memory(TrainingConfig.from_dict({}), SIZES, torch.device("cpu"))


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
def test_inside_a_memory_cgroup_a_run_that_cannot_fit_is_refused_before_any_work_and_one_that_fits_trains(tmp_path):
    project = copy_project(tmp_path / "project")
    tables = "--params=metadata.use_modulus_hash=true,metadata.modulus_hash_size=100000,training.max_steps=20"
    refused = _in_group(2_000_000_000, project, tables)
    assert refused.returncode != 0
    assert "more than the memory cgroup" in refused.stderr and "criteo_dlrm_test_" in refused.stderr
    assert not (project / "data/02_intermediate").exists() or not any((project / "data/02_intermediate").iterdir())
    trained = _in_group(4_500_000_000, project, tables)
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert "training finished at step 20" in trained.stdout + trained.stderr


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
