import os

import pytest
import torch

from criteo_dlrm.engine.device import autocast, compile_model, configure_backends, resolve_device
from criteo_dlrm.models import DLRM
from criteo_dlrm.models.dlrm import ConfigError
from tests.conftest import tiny_model_config

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_auto_picks_cuda_only_when_present():
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == torch.device("cpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on machines without CUDA")
def test_asking_for_cuda_without_it_is_a_clear_error():
    with pytest.raises(
        ConfigError, match="evaluation.device is 'cuda' but .*no usable CUDA device.*evaluation.device=auto"
    ):
        resolve_device("cuda", "evaluation.device")
    with pytest.raises(ConfigError, match="no usable CUDA"):
        resolve_device("cuda:1")


def test_unknown_devices_are_refused():
    with pytest.raises(ConfigError, match="is not a device"):
        resolve_device("gpu0")
    with pytest.raises(ConfigError, match="not supported"):
        resolve_device("meta")


def test_threads_are_set_explicitly_and_tf32_only_on_cuda():
    before = torch.get_num_threads()
    try:
        assert configure_backends(torch.device("cpu"), allow_tf32=True, num_threads=1) == {"num_threads": 1}
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_bf16_autocast_runs_matmuls_in_bf16_and_fp32_is_untouched():
    a = torch.randn(4, 4)
    with autocast(torch.device("cpu"), "bf16"):
        assert (a @ a).dtype == torch.bfloat16
    with autocast(torch.device("cpu"), "fp32"):
        assert (a @ a).dtype == torch.float32
    with pytest.raises(ConfigError, match="precision must be one of"):
        autocast(torch.device("cpu"), "fp16")


def test_a_runtime_is_the_device_and_precision_a_model_computes_with_and_a_mode_holds_its_own():
    from criteo_dlrm.config.training import TrainingConfig
    from criteo_dlrm.engine.device import Runtime
    from criteo_dlrm.engine.parallel.modes import build_mode
    from tests.conftest import TINY_MODEL

    a = torch.randn(4, 4)
    with Runtime(torch.device("cpu"), "bf16").autocast():
        assert (a @ a).dtype == torch.bfloat16
    with Runtime().autocast():
        assert (a @ a).dtype == torch.float32
    config = TrainingConfig.from_dict({**TINY_MODEL, "precision": "bf16"})
    mode = build_mode(config.model_config([5] * 26), config, torch.device("cpu"))
    assert mode.runtime == Runtime(torch.device("cpu"), "bf16", None)


def _small_model() -> DLRM:
    torch.manual_seed(0)
    return DLRM(
        tiny_model_config(
            [5] * 26,
            sparse_embedding_sizes=4,
            dense_mlp={"hidden_layer_sizes": [8], "output_size": 4},
            prediction_hidden_sizes=[8],
        )
    )


@pytest.mark.slow
def test_compiled_model_matches_eager_and_keeps_state_dict_keys():
    eager, compiled = _small_model(), compile_model(_small_model())
    assert list(compiled.state_dict()) == list(eager.state_dict())
    dense, sparse = torch.randn(32, 13), torch.randint(0, 5, (32, 26))
    torch.testing.assert_close(compiled(dense, sparse), eager(dense, sparse), rtol=1e-4, atol=1e-5)
    compiled(dense, sparse).sum().backward()
    assert compiled.embeddings[0].weight.weight.grad.is_sparse


@pytest.mark.slow
def test_compile_captures_a_graph_of_each_mlp():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    compiled = compile_model(_small_model())
    for _ in range(2):
        compiled(torch.randn(16, 13), torch.randint(0, 5, (16, 26))).sum().backward()
    # One graph for each MLP: a plain nn.Sequential compiled with Module.compile captured none and ran eagerly.
    assert counters["stats"]["unique_graphs"] == 2
    assert counters["frames"]["ok"] == 2


@pytest.mark.gpu
@needs_cuda
def test_cuda_training_step_with_bf16_tf32_and_pinned_batches():
    from criteo_dlrm.data.batches import Batch

    device = resolve_device("auto")
    assert configure_backends(device, allow_tf32=True, num_threads=None)["tf32"] is True
    assert torch.backends.cuda.matmul.allow_tf32
    model = _small_model().to(device)
    batch = Batch(torch.rand(64).round(), torch.randn(64, 13), torch.randint(0, 5, (64, 26))).pin_memory()
    assert batch.dense.is_pinned()
    batch = batch.to(device, non_blocking=True)
    with autocast(device, "bf16"):
        logits = model(batch.dense, batch.sparse)
    assert logits.dtype == torch.bfloat16
    torch.nn.functional.binary_cross_entropy_with_logits(logits.float(), batch.labels).backward()
    assert model.embeddings[0].weight.weight.grad.is_sparse


@pytest.mark.gpu
@needs_cuda
def test_compiled_model_on_cuda_matches_eager():
    device = torch.device("cuda")
    eager, compiled = _small_model().to(device), compile_model(_small_model().to(device), "max-autotune")
    dense, sparse = torch.randn(256, 13, device=device), torch.randint(0, 5, (256, 26), device=device)
    torch.testing.assert_close(compiled(dense, sparse), eager(dense, sparse), rtol=1e-3, atol=1e-3)


def test_default_threads_are_the_cores_left_idle_by_other_processes(monkeypatch):
    from criteo_dlrm.engine import device

    monkeypatch.setattr(device.os, "cpu_count", lambda: 2)
    for idle, threads in ((1.96, 2), (0.98, 1), (0.1, 1), (None, 2)):
        monkeypatch.setattr(device, "idle_cores", lambda idle=idle: idle)
        assert device.default_threads() == threads, idle
    monkeypatch.undo()
    measured = device.idle_cores(0.05)
    assert measured is None or 0 <= measured <= os.cpu_count() + 0.01
