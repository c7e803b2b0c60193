"""The parallel modes: which one a run gets, what each builds and reports, and that each holds its parts."""

import numpy as np
import pytest
import torch
import torch.distributed as dist

from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.engine.memory import embedding_bytes
from criteo_dlrm.engine.parallel.group import Group
from criteo_dlrm.engine.parallel.modes import Mode, Replicated, ShardedTables, build_mode, placement_class
from tests.conftest import TINY_MODEL

SIZES = [3 + 5 * f for f in range(26)]
CPU = torch.device("cpu")


def _config(**values) -> TrainingConfig:
    return TrainingConfig.from_dict({**TINY_MODEL, **values})


def _torchrec(**values) -> TrainingConfig:
    return _config(embedding_backend="torchrec", embedding_optimizer="rowwise_adagrad", **values)


def test_the_backend_chooses_the_placement_and_the_process_group_the_group():
    assert placement_class(_config()) is Replicated
    assert placement_class(_torchrec()) is ShardedTables
    alone = Group()
    assert (alone.rank, alone.world_size, alone.backend, alone.is_main) == (0, 1, None, True)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        group = Group()
        assert (group.world_size, group.backend) == (1, "gloo")
        assert Group(alone=True).backend is None, "the precision probe's steps run alone inside a group"
        mode = build_mode(_config().model_config(SIZES), _config(), CPU)
        assert mode.train_model is mode.model, "a group of one trains alone: no DDP"
        assert mode.runtime.backend == "gloo", "where its predictions are gathered"
    finally:
        dist.destroy_process_group()


def test_a_single_process_builds_its_model_and_counts_every_parameter():
    config = _config()
    torch.manual_seed(0)
    mode = build_mode(config.model_config(SIZES), config, CPU)
    assert type(mode.placement) is Replicated and mode.train_model is mode.model
    assert mode.optimizers is mode.placement.optimizers and list(mode.optimizers) == ["dense", "embeddings"]
    assert mode.parameter_count() == sum(p.numel() for p in mode.model.parameters())
    assert mode.placement.summary() == {
        "backend": "torch",
        "bytes_per_process": embedding_bytes(SIZES, [8] * 26, "sparse_adam"),
    }
    assert mode.is_main and mode.world_size == 1 and mode.loss_weight(64) == 1 / 64
    assert all(p.grad is None for p in mode.model.parameters())
    torch.manual_seed(0)
    again = build_mode(config.model_config(SIZES), config, CPU)
    for (name, value), other in zip(mode.model.state_dict().items(), again.model.state_dict().values(), strict=True):
        assert torch.equal(value, other), f"{name}: the model comes from the torch seed"


def test_the_model_follows_the_optimiser_s_gradients_and_the_compile_setting():
    dense = build_mode(_config().model_config(SIZES), _config(embedding_optimizer="dense_adam"), CPU)
    assert not dense.model.embeddings[0].weight.sparse
    sparse = build_mode(_config().model_config(SIZES), _config(), CPU)
    assert sparse.model.embeddings[0].weight.sparse
    compiled = build_mode(_config().model_config(SIZES), _config(compile=True), CPU)
    assert hasattr(compiled.model.dense_mlp, "_compiled_call_impl") and compiled.model.dense_mlp._compiled_call_impl


def test_a_sharded_mode_builds_torchrec_s_model_in_a_group_of_its_own_and_reports_its_plan():
    pytest.importorskip("torchrec", reason="the torchrec extra is not installed")
    config = _torchrec()
    assert not dist.is_initialized()
    with ShardedTables.process_group(CPU):
        assert dist.get_world_size() == 1
        torch.manual_seed(0)
        mode = build_mode(config.model_config(SIZES), config, CPU)
        summary = mode.placement.summary()
        torch.manual_seed(0)
        alone = build_mode(config.model_config(SIZES), _config(), CPU)
        assert mode.parameter_count() == alone.parameter_count(), "the sharded tables are counted whole"
    assert not dist.is_initialized(), "its own group is closed again"
    assert type(mode.placement) is ShardedTables and list(mode.optimizers) == ["dense"], (
        "the tables' optimiser is fused"
    )
    assert summary["backend"] == "torchrec" and [t["table"] for t in summary["tables"]] == [
        f"SPARSE_{i}" for i in range(26)
    ]
    assert summary["bytes_per_rank"] == [embedding_bytes(SIZES, [8] * 26, "rowwise_adagrad")]


def test_a_replica_in_a_group_of_more_than_one_is_data_parallel_and_rank_1_writes_nothing(monkeypatch):
    """Rank 1 of 2 (the group stood in): its replica under DDP with the sparse tables left out of it, its loss weighted
    by the processes' number, nothing of its state handed out (rank 0 writes the replicas' one state)."""
    from criteo_dlrm.engine.parallel import modes

    wrapped, ignored = [], []

    class StandInDDP:
        def __init__(self, model, **options):
            wrapped.append(options)

        @staticmethod
        def _set_params_and_buffers_to_ignore_for_model(model, names):
            ignored.extend(names)

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_world_size", lambda *args: 2)
    monkeypatch.setattr(dist, "get_rank", lambda *args: 1)
    monkeypatch.setattr(dist, "get_backend", lambda *args: "gloo")
    monkeypatch.setattr(modes, "DistributedDataParallel", StandInDDP)
    config = _config()
    mode = build_mode(config.model_config(SIZES), config, CPU)
    [options] = wrapped
    assert isinstance(mode.train_model, StandInDDP) and options.pop("device_ids") is None
    assert options in ({"forward_sync_buffers": False}, {"broadcast_buffers": False}), "the buffers are constants"
    tables = len(mode.model.embedding_parameters())
    assert len(ignored) == tables > 0 and all(name.startswith("embeddings.") for name in ignored), ignored
    assert not mode.is_main and mode.world_size == 2 and mode.loss_weight(64) == 2 / 64
    assert mode.placement.saved_state() is None
    assert mode.runtime.backend == "gloo"


def test_a_data_parallel_replica_is_built_without_warnings_and_syncs_no_buffers_before_a_forward():
    """Real DDP around the replica, in a gloo group of one: torch 2.13 renamed DDP's ``broadcast_buffers`` and the old
    name printed a FutureWarning in every training process's log; the model's buffers are constants either way."""
    import warnings

    from torch.nn.parallel import DistributedDataParallel

    from criteo_dlrm.engine.parallel.modes import mode_around
    from criteo_dlrm.models.dlrm import DLRM

    config = _config()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = DLRM(config.model_config(SIZES), sparse_gradients=config.sparse_gradients)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            mode = mode_around(model, config, CPU, data_parallel=True)
        assert isinstance(mode.train_model, DistributedDataParallel)
        assert list(mode.train_model.module.buffers()), "the model has buffers to leave alone"
        assert not mode.train_model.will_sync_module_buffers()
        del mode  # DDP's reducer before the group it holds (freed after, it can deadlock the group's threads)
    finally:
        dist.destroy_process_group()


def test_every_mode_is_its_parts():
    """One ``Mode`` class of a placement, a group and a runtime: the step and the loop call the parts."""
    config = _config()
    built = build_mode(config.model_config([5] * 26), config, CPU)
    assert type(built) is Mode and isinstance(built.group, Group) and built.runtime.device == CPU
    for placement in (Replicated, ShardedTables):
        for name in ("check", "process_group", "build", "summary", "describe", "exchange_gradients"):
            assert callable(getattr(placement, name, None)), (placement, name)
        assert placement.__mro__ == (placement, object), f"{placement.__name__} overrides no other placement"


def test_a_sharded_mode_s_collectives_take_only_tensors_on_its_device_as_nccl_does():
    """Under a group that refuses host tensors as NCCL does (tests/nccl_like.py), TorchRec's mode is built with resume
    on (its weights checked at once), trains a step, checks its weights, averages and validates: a tensor made
    without a device in any of its collectives fails here as it fails on a GPU."""
    pytest.importorskip("torchrec", reason="the torchrec extra is not installed")
    from criteo_dlrm.data.batches import Batch, BatchLoader
    from criteo_dlrm.engine.parallel.group import gather_rows_to_main
    from criteo_dlrm.engine.training.step import TrainStep
    from tests.engine.parallel.test_group import _arrays
    from tests.nccl_like import HostTensorError, nccl_like

    config = _torchrec()
    arrays = _arrays(np.random.default_rng(0), 64)
    with nccl_like(), ShardedTables.process_group(CPU):
        with pytest.raises(HostTensorError, match="NCCL refuses it"):
            gather_rows_to_main(1, 0, torch.from_numpy(np.arange(3.0)))  # host rows, as a GPU run would hold them
        torch.manual_seed(0)
        mode = build_mode(config.model_config([5] * 26), config, CPU)
        batch = Batch(torch.rand(16).round(), torch.randn(16, 13), torch.randint(0, 5, (16, 26))).to(CPU)
        TrainStep(mode, config)(batch, 0, 1)
        assert mode.weights_finite()
        assert mode.group.mean(torch.ones(2, device=CPU)).tolist() == [1.0, 1.0]
        assert mode.runtime.backend == "nccl", "the package takes its NCCL branches"
        assert len(mode.group.predict(mode.model, BatchLoader(arrays, 8), mode.runtime)) == 64
        del mode  # its DDP before the group it holds (the group ends with the block)


def test_a_mode_hands_out_its_live_state_and_the_in_progress_checkpoint_alone_writes_it():
    """Issue 60 item 2: the modes took the progress files and wrote them; the in-progress checkpoint is now one
    module (``engine.training.run_state``) writing what a mode hands out."""
    import ast
    import inspect

    from criteo_dlrm.engine.parallel import modes

    config = _config()
    torch.manual_seed(0)
    mode = build_mode(config.model_config(SIZES), config, CPU)
    state = mode.placement.saved_state()
    assert state.shards is None and set(state.weights.to_dict()) == {"model_state", "optimizer_state"}
    live = mode.model.state_dict()
    assert all(state.weights.model_state[name].data_ptr() == tensor.data_ptr() for name, tensor in live.items())
    names = {node.id for node in ast.walk(ast.parse(inspect.getsource(modes))) if isinstance(node, ast.Name)}
    attributes = {n.attr for n in ast.walk(ast.parse(inspect.getsource(modes))) if isinstance(n, ast.Attribute)}
    assert not names & {"ProgressFiles", "save_atomically", "load_checkpoint"}
    assert not attributes & {"save", "save_sharded", "state_folder"}, "a mode writes or finds no file"
