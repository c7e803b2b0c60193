"""Averages and validation over a process group: rows of any count per process gathered in rank order, to every
process or to rank 0 alone, and one process's predictions and metrics from a group of one."""

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.engine.device import Runtime
from criteo_dlrm.engine.group import InGroup, all_gather_rows, gather_rows_to_main, predict_alone
from criteo_dlrm.engine.metrics import MetricError, binary_metrics
from criteo_dlrm.models.dlrm import DLRM
from tests.conftest import TINY_MODEL


def _rows(rank: int) -> torch.Tensor:
    return torch.arange(3 * (rank + 1) * 2, dtype=torch.float32).reshape(-1, 2) + 100 * rank  # 3 rows, then 6


def _two_ranks(rank: int, store_path: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    try:
        mine = _rows(rank)
        [everyone] = all_gather_rows(2, mine)
        on_main = gather_rows_to_main(2, rank, mine)
        group = InGroup()
        mean = group.mean(torch.tensor([float(rank), 10.0]))
        try:
            group.metrics(np.array([1, 1]), np.array([0.5, 0.5]) if rank == 0 else None)
            undefined = ""
        except MetricError as error:
            undefined = str(error)
        results.put((rank, [t.tolist() for t in everyone], on_main and [t.tolist() for t in on_main], mean.tolist(),
                     undefined))  # fmt: skip
    finally:
        dist.destroy_process_group()


def test_rows_of_different_counts_are_gathered_in_rank_order_and_an_undefined_metric_fails_every_rank(tmp_path):
    context = mp.get_context("spawn")
    results = context.Queue()
    processes = [context.Process(target=_two_ranks, args=(r, str(tmp_path / "store"), results)) for r in (0, 1)]
    for process in processes:
        process.start()
    outcomes = dict((r, rest) for r, *rest in (results.get(timeout=120) for _ in processes))
    for process in processes:
        process.join(60)
        assert process.exitcode == 0
    expected = [_rows(0).tolist(), _rows(1).tolist()]
    with pytest.raises(MetricError) as alone:
        binary_metrics(np.array([1, 1]), np.array([0.5, 0.5]))
    for rank, (everyone, on_main, mean, undefined) in outcomes.items():
        assert everyone == expected, "every process gets every row, trimmed of the padding"
        assert on_main == (expected if rank == 0 else None), "gathered to rank 0 alone"
        assert mean == [0.5, 10.0]
        assert undefined == str(alone.value), "rank 0's error is raised in every rank"


def test_a_group_of_one_predicts_and_scores_as_one_process():
    from criteo_dlrm.config.training import TrainingConfig

    config = TrainingConfig.from_dict(TINY_MODEL)
    torch.manual_seed(0)
    model = DLRM(config.model_config([5] * 26)).eval()
    rng = np.random.default_rng(0)
    arrays = _arrays(rng, 37)
    loader = BatchLoader(arrays, 8)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        group = InGroup()
        gathered = group.predict(model, loader, Runtime())
        scored = group.metrics(arrays.labels, gathered)
    finally:
        dist.destroy_process_group()
    alone = predict_alone(model, loader, Runtime())
    with torch.no_grad():
        direct = torch.sigmoid(model(torch.from_numpy(arrays.dense), torch.from_numpy(arrays.sparse))).numpy()
    np.testing.assert_allclose(gathered, alone)
    np.testing.assert_allclose(alone, direct, rtol=1e-5, atol=1e-6)
    assert scored == pytest.approx(binary_metrics(arrays.labels, direct))


def _arrays(rng, rows: int):
    from criteo_dlrm.data.batches import EncodedArrays

    return EncodedArrays(
        labels=(rng.random(rows) < 0.4).astype(np.float32),
        dense=rng.standard_normal((rows, 13)).astype(np.float32),
        sparse=rng.integers(0, 5, (rows, 26)).astype(np.int64),
    )
