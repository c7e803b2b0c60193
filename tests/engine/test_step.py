"""One optimisation step against a hand-computed one: the mean loss over the batch, Adam's first step on the
dense layers, plain SGD on the looked-up table rows."""

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.batches import Batch
from criteo_dlrm.engine.modes import build_mode
from criteo_dlrm.engine.step import PHASES, TrainStep, learning_rate_factor
from tests.conftest import TINY_MODEL

SIZES = [4 + 3 * f for f in range(26)]


def test_a_step_is_the_mean_loss_and_each_optimiser_s_first_update():
    config = TrainingConfig.from_dict(
        {**TINY_MODEL, "embedding_optimizer": "sgd", "embedding_learning_rate": 0.5, "learning_rate": 0.01}
    )
    torch.manual_seed(0)
    mode = build_mode(config.model_config(SIZES), config, torch.device("cpu"))
    reference = copy.deepcopy(mode.model)
    generator = torch.Generator().manual_seed(1)
    dense = torch.randn(32, 13, generator=generator)
    sparse = torch.stack([torch.randint(0, size, (32,), generator=generator) for size in SIZES], dim=1)
    labels = (torch.rand(32, generator=generator) < 0.3).float()
    timings = dict.fromkeys(PHASES, 0.0)

    loss = TrainStep(mode, config)(Batch(labels, dense, sparse), 0, 10, timings)

    expected = F.binary_cross_entropy_with_logits(reference(dense, sparse), labels)
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
