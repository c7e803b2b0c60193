"""One optimisation step against a hand-computed one: the mean loss over the batch, Adam's first step on the
dense layers, plain SGD on the looked-up table rows."""

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.batches import Batch
from criteo_dlrm.engine.parallel.modes import build_mode
from criteo_dlrm.engine.training.step import PHASES, TrainStep, learning_rate_factor
from tests.conftest import TINY_MODEL

SIZES = [4 + 3 * f for f in range(26)]


def _mode_and_batch(config: TrainingConfig):
    """The mode built from ``config`` (seed 0), a copy of its model before any step, and a batch of 32 rows."""
    torch.manual_seed(0)
    mode = build_mode(config.model_config(SIZES), config, torch.device("cpu"))
    reference = copy.deepcopy(mode.model)
    generator = torch.Generator().manual_seed(1)
    dense = torch.randn(32, 13, generator=generator)
    sparse = torch.stack([torch.randint(0, size, (32,), generator=generator) for size in SIZES], dim=1)
    labels = (torch.rand(32, generator=generator) < 0.3).float()
    return mode, reference, Batch(labels, dense, sparse)


def test_a_step_is_the_mean_loss_and_each_optimiser_s_first_update():
    config = TrainingConfig.from_dict(
        {**TINY_MODEL, "embedding_optimizer": "sgd", "embedding_learning_rate": 0.5, "learning_rate": 0.01}
    )
    mode, reference, batch = _mode_and_batch(config)
    timings = dict.fromkeys(PHASES, 0.0)

    loss = TrainStep(mode, config)(batch, 0, 10, timings)

    expected = F.binary_cross_entropy_with_logits(reference(batch.dense, batch.sparse), batch.labels)
    torch.testing.assert_close(loss, expected.detach())
    expected.backward()
    after, before = dict(mode.model.named_parameters()), dict(reference.named_parameters())
    for name, parameter in before.items():
        gradient = parameter.grad.to_dense() if parameter.grad.is_sparse else parameter.grad
        if name.startswith("embeddings."):
            wanted = parameter - 0.5 * gradient  # SGD
        else:
            wanted = parameter - 0.01 * gradient / (gradient.abs() + 1e-8)  # Adam's first step, bias-corrected
        torch.testing.assert_close(after[name], wanted, rtol=1e-5, atol=1e-6, msg=name)
    assert all(seconds >= 0 for seconds in timings.values()) and sum(timings.values()) > 0


@pytest.mark.parametrize("dense_optimizer", ["adagrad", "sgd"])
def test_the_recipes_dense_optimisers_take_their_first_step_by_hand(dense_optimizer):
    """Issue 47 item 2: MLPerf's DLRM-DCNv2 trains the dense layers and the tables with Adagrad (its epsilon set),
    TorchRec's example with SGD. Adagrad's first step: sum = g^2, w -= lr g / (sqrt(sum) + eps); a large epsilon
    shows that the setting reaches both optimisers."""
    eps, rate, embedding_rate = 0.1, 0.01, 0.5
    config = TrainingConfig.from_dict(
        {**TINY_MODEL, "dense_optimizer": dense_optimizer, "learning_rate": rate, "adagrad_eps": eps,
         "embedding_optimizer": "adagrad", "embedding_learning_rate": embedding_rate}
    )  # fmt: skip
    mode, reference, batch = _mode_and_batch(config)

    TrainStep(mode, config)(batch, 0, 10)

    F.binary_cross_entropy_with_logits(reference(batch.dense, batch.sparse), batch.labels).backward()
    after = dict(mode.model.named_parameters())
    for name, parameter in reference.named_parameters():
        gradient = parameter.grad.to_dense() if parameter.grad.is_sparse else parameter.grad
        if name.startswith("embeddings."):
            wanted = parameter - embedding_rate * gradient / (gradient.abs() + eps)
        elif dense_optimizer == "adagrad":
            wanted = parameter - rate * gradient / (gradient.abs() + eps)
        else:
            wanted = parameter - rate * gradient
        torch.testing.assert_close(after[name], wanted, rtol=1e-5, atol=1e-6, msg=name)


def test_a_step_decay_changes_every_rate_once_at_its_fraction_of_the_run():
    """TorchRec's DLRM example: 15.0, then 0.2 from 80% of the run on, the embeddings' rate alike."""
    config = TrainingConfig.from_dict({"learning_rate": 15.0, "embedding_learning_rate": 15.0, "decay": "step",
                                       "step_decay": {"at": 0.8, "learning_rate": 0.2}})  # fmt: skip
    factors = [learning_rate_factor(step, 100, config) for step in (0, 79, 80, 99)]
    assert [15.0 * f for f in factors] == pytest.approx([15.0, 15.0, 0.2, 0.2])
    warm = TrainingConfig.from_dict(
        {"warmup_steps": 10, "decay": "step", "step_decay": {"at": 0.5, "learning_rate": 1e-4}}
    )
    assert [learning_rate_factor(s, 100, warm) for s in (4, 49, 50)] == pytest.approx([0.5, 1.0, 0.1])


def test_warm_up_and_decay_schedules():
    config = TrainingConfig(warmup_steps=4, decay="linear")
    assert [learning_rate_factor(s, 12, config) for s in (0, 3, 4, 8, 12)] == [0.25, 1.0, 1.0, 0.5, 0.0]
    cosine = TrainingConfig(decay="cosine")
    assert learning_rate_factor(5, 10, cosine) == pytest.approx(0.5)
    assert learning_rate_factor(7, 10, TrainingConfig()) == 1.0


def test_phases_are_timed_on_the_cpu_and_on_cuda_only_when_asked_or_profiling():
    """Timing a CUDA phase synchronises the GPU four times a step: off there unless asked for or profiling."""

    def step(device: str, **settings) -> TrainStep:
        return TrainStep(SimpleNamespace(device=torch.device(device)), TrainingConfig.from_dict(settings))

    assert step("cpu").timed and not step("cpu").synchronise
    assert not step("cuda").timed and not step("cuda").synchronise
    assert step("cuda", profiler={"enabled": True}).synchronise
    assert step("cuda", phase_timing=True).synchronise
    assert not step("cpu", phase_timing=False).timed


def test_the_looked_up_squares_come_from_training_passes_of_a_model_that_returns_logits_only():
    from criteo_dlrm.engine.training.step import LookedUpSquares

    config = TrainingConfig.from_dict({**TINY_MODEL, "embedding_weight_decay": 0.01})
    mode, _, batch = _mode_and_batch(config)
    model, squares = mode.model, LookedUpSquares(mode.model)
    model.eval()
    with torch.no_grad():
        logits = model(batch.dense, batch.sparse)
    assert isinstance(logits, torch.Tensor) and logits.shape == (32,)
    with pytest.raises(RuntimeError, match="no training forward pass"):
        squares.take()  # evaluation adds nothing
    model.train()
    with torch.no_grad():
        model(batch.dense, batch.sparse)
        looked_up = torch.cat([e.reshape(32, -1) for e in model.embed(batch.sparse)], dim=1)
    assert float(squares.take()) == pytest.approx(float(looked_up.square().sum()), rel=1e-6)
    squares.remove()
    model(batch.dense, batch.sparse)
    with pytest.raises(RuntimeError):
        squares.take()


_MLPERF_HOTS = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"multi_hot_sizes": _MLPERF_HOTS},
        {"interaction": "dcn", "sparse_embedding_sizes": [4] * 13 + [8] * 13, "embedding_optimizer": "sgd"},
        {"embedding_weight_decay": 1e-6, "embedding_optimizer": "adagrad"},
    ],
    ids=["single-hot", "multi-hot", "dcn, two table groups", "weight decay, adagrad"],
)
def test_a_training_step_waits_for_the_device_only_to_count_each_table_group_s_rows(settings):
    """On a GPU the host runs ahead of the kernels it queues; each read-back, data-sized output or copy from host
    memory in a step makes it wait (tests/host_syncs.py counts them on the CPU). A step waits once per table group,
    where the optimiser sums its gradient's duplicate rows (their number is the data's); nothing else in forward,
    backward or the optimisers reads the device back (multi-hot copied its bag offsets from host memory on every
    forward pass, and the tables' columns were picked with a Python list)."""
    from tests.host_syncs import HostSyncs

    config = TrainingConfig.from_dict({**TINY_MODEL, "phase_timing": False, **settings})
    mode, _, batch = _mode_and_batch(config)
    step = TrainStep(mode, config)
    step(batch, 0, 10)  # the first step makes the optimisers' state
    # torch's optimisers keep their step counts in host memory (not capturable, not fused): reading one waits for
    # nothing.
    counts = [state["step"] for name in mode.optimizers for state in mode.optimizers[name].state.values()]
    with HostSyncs(on_the_host=[c for c in counts if isinstance(c, torch.Tensor)]) as syncs:
        for index in (1, 2):
            step(batch, index, 10)
    sums_rows = config.embedding_optimizer in ("sparse_adam", "adagrad")  # SGD adds the duplicates as they come
    groups = len(mode.model.embeddings) if sums_rows else 0
    # On the CPU SparseAdam sums them with unique (a GPU coalesces): either waits once.
    assert syncs.counts.pop("coalesce", 0) + syncs.counts.pop("unique", 0) == 2 * groups
    assert dict(syncs.counts) == {}, "nothing else waits for the device"


def test_a_data_parallel_step_waits_once_more_for_every_table_group_s_row_counts_together():
    """The replicas' sparse gradients are exchanged with one read-back of every group's row counts (on a GPU a
    wait for the device), besides each group's summed rows: with two groups, five waits a step (there were nine with
    two processes: each group's counts copied from host memory, their largest read, each process's count read)."""
    import torch.distributed as dist

    from criteo_dlrm.engine.parallel.group import destroy_group
    from criteo_dlrm.engine.parallel.modes import mode_around
    from criteo_dlrm.models.dlrm import DLRM
    from tests.host_syncs import HostSyncs

    settings = {"interaction": "dcn", "sparse_embedding_sizes": [4] * 13 + [8] * 13, "phase_timing": False}
    config = TrainingConfig.from_dict({**TINY_MODEL, **settings})
    _, _, batch = _mode_and_batch(config)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = DLRM(config.model_config(SIZES), sparse_gradients=config.sparse_gradients)
        mode = mode_around(model, config, torch.device("cpu"), data_parallel=True)  # DDP and the exchange
        step = TrainStep(mode, config)
        step(batch, 0, 10)
        counts = [state["step"] for name in mode.optimizers for state in mode.optimizers[name].state.values()]
        with HostSyncs(on_the_host=[c for c in counts if isinstance(c, torch.Tensor)]) as syncs:
            step(batch, 1, 10)
        del mode, step  # the model's DDP before the group it holds
    finally:
        destroy_group()
    # Each group's rows summed before the exchange, and again across the processes by the optimiser.
    assert syncs.counts.pop("coalesce", 0) + syncs.counts.pop("unique", 0) == 2 * 2
    assert dict(syncs.counts) == {"tolist": 1}, "every group's row counts read back together"
