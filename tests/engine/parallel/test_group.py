"""Averages and validation over a process group: rows of any count per process gathered in rank order, to every
process or to rank 0 alone, and one process's predictions and metrics from a group of one."""

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.engine.device import Runtime
from criteo_dlrm.engine.parallel.group import Group, all_gather_rows, gather_rows_to_main, predict_alone
from criteo_dlrm.engine.trained.metrics import MetricError, binary_metrics
from criteo_dlrm.models.dlrm import DLRM
from tests.conftest import TINY_MODEL


def _rows(rank: int) -> torch.Tensor:
    # On the run's device, named (under nccl_like_processes a tensor made without one is refused, as NCCL would).
    rows = torch.arange(3 * (rank + 1) * 2, dtype=torch.float32, device=torch.device("cpu"))
    return rows.reshape(-1, 2) + 100 * rank  # 3 rows, then 6


def _two_ranks(rank: int, store_path: str, results) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=2)
    try:
        mine = _rows(rank)
        [everyone] = all_gather_rows(2, mine)
        on_main = gather_rows_to_main(2, rank, mine)
        group = Group()
        mean = group.mean(torch.tensor([float(rank), 10.0], device=torch.device("cpu")))
        try:
            group.metrics(np.array([1, 1]), np.array([0.5, 0.5]) if rank == 0 else None)
            undefined = ""
        except MetricError as error:
            undefined = str(error)
        results.put((rank, [t.tolist() for t in everyone], on_main and [t.tolist() for t in on_main], mean.tolist(),
                     undefined))  # fmt: skip
    finally:
        dist.destroy_process_group()


def test_rows_of_different_counts_are_gathered_in_rank_order_and_an_undefined_metric_fails_every_rank(
    tmp_path, nccl_like_processes
):
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
        group = Group()
        gathered = group.predict(model, loader, Runtime())
        scored = group.metrics(arrays.labels, gathered)
    finally:
        dist.destroy_process_group()
    alone = predict_alone(model, loader, Runtime())
    with torch.no_grad():
        direct = torch.sigmoid(model(torch.from_numpy(arrays.dense), torch.from_numpy(arrays.sparse))).numpy()
    np.testing.assert_allclose(gathered, alone)
    np.testing.assert_allclose(alone, direct, rtol=1e-5, atol=1e-6)
    assert scored.to_dict() == pytest.approx(binary_metrics(arrays.labels, direct).to_dict())


def _arrays(rng, rows: int):
    from criteo_dlrm.data.batches import EncodedArrays

    return EncodedArrays(
        labels=(rng.random(rows) < 0.4).astype(np.float32),
        dense=rng.standard_normal((rows, 13)).astype(np.float32),
        sparse=rng.integers(0, 5, (rows, 26)).astype(np.int64),
    )


_COLLECTIVES = {"all_reduce", "all_gather", "all_gather_into_tensor", "broadcast", "reduce", "gather", "scatter",
                "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "send", "recv"}  # fmt: skip
_MADE_FROM_NOTHING = {"tensor", "zeros", "ones", "empty", "full", "arange", "as_tensor", "from_numpy", "rand", "randn"}


def test_no_collective_of_the_package_takes_a_tensor_made_without_a_device():
    """Every tensor this package hands a collective (``dist.all_reduce(x)``, ...) that its own function made with
    ``torch.tensor``, ``torch.zeros``, ... names a device: one made without is a CPU tensor on a GPU run, which NCCL
    refuses (TorchRec's weights check did, as its Trainer was built). The runs under ``nccl_like_processes`` check
    the paths they take; this reads every call."""
    import ast

    from tests.conftest import PROJECT_ROOT

    found, calls = [], 0
    for path in sorted((PROJECT_ROOT / "src" / "criteo_dlrm").rglob("*.py")):
        tree = ast.parse(path.read_text())
        for function in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            made = {}  # name -> the call that made it, in this function
            for node in ast.walk(function):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
                    for target in node.targets:
                        if isinstance(target, ast.Name):
                            made[target.id] = node.value
            for node in ast.walk(function):
                call = node if isinstance(node, ast.Call) else None
                if not (call and isinstance(call.func, ast.Attribute) and call.func.attr in _COLLECTIVES):
                    continue
                if not (isinstance(call.func.value, ast.Name) and call.func.value.id == "dist"):
                    continue
                calls += 1
                for argument in [*call.args, *(k.value for k in call.keywords)]:
                    source = made.get(argument.id) if isinstance(argument, ast.Name) else None
                    if source is None and isinstance(argument, ast.Call):
                        source = argument
                    if (
                        isinstance(source, ast.Call)
                        and isinstance(source.func, ast.Attribute)
                        and isinstance(source.func.value, ast.Name)
                        and source.func.value.id == "torch"
                        and source.func.attr in _MADE_FROM_NOTHING
                        and not any(k.arg == "device" for k in source.keywords)
                    ):
                        found.append(f"{path.relative_to(PROJECT_ROOT)}:{call.lineno} dist.{call.func.attr}")
    assert calls >= 6, "the package's collectives were found"
    assert found == []
