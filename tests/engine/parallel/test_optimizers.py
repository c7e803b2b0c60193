"""The optimisers a mode steps: built over the right parameters from the one table, scaled from their base rates,
their state written and restored together."""

import pytest
import torch

from criteo_dlrm.config.training import EMBEDDING_OPTIMIZERS, TrainingConfig
from criteo_dlrm.engine.parallel.modes import build_mode
from criteo_dlrm.engine.parallel.optimizers import Optimizers, SparseAdam, build_optimizers, summed_rows
from tests.conftest import TINY_MODEL

SIZES = [3 + 5 * f for f in range(26)]
CPU = torch.device("cpu")


def _config(**values) -> TrainingConfig:
    return TrainingConfig.from_dict({**TINY_MODEL, **values})


@pytest.mark.parametrize("name", [n for n, o in EMBEDDING_OPTIMIZERS.items() if o.torch is not None])
def test_every_torch_optimiser_of_the_table_is_built_over_the_right_parameters(name):
    config = _config(embedding_optimizer=name)
    model = build_mode(config.model_config(SIZES), config, CPU).model
    optimizers = build_optimizers(model, config)
    row = EMBEDDING_OPTIMIZERS[name]
    if row.whole_model:
        assert list(optimizers) == ["dense"] and type(optimizers["dense"]) is torch.optim.Adam
        assert sum(len(g["params"]) for g in optimizers["dense"].param_groups) == len(list(model.parameters()))
        return
    assert isinstance(optimizers["embeddings"], getattr(torch.optim, row.torch))
    held = {id(p) for g in optimizers["embeddings"].param_groups for p in g["params"]}
    assert held == {id(p) for p in model.embedding_parameters()}
    assert optimizers["embeddings"].param_groups[0]["lr"] == config.embedding_learning_rate


def test_the_table_s_fused_optimisers_are_torchrec_s():
    torchrec_optim = pytest.importorskip("torchrec.optim", reason="the torchrec extra is not installed")
    for name, row in EMBEDDING_OPTIMIZERS.items():
        assert row.fused is None or hasattr(torchrec_optim, row.fused), name
        assert row.torch is None or hasattr(torch.optim, row.torch), name


def test_rates_scale_from_the_base_rates_not_from_the_last_scaled_ones():
    config = _config(learning_rate=0.01, embedding_learning_rate=0.2)
    model = build_mode(config.model_config(SIZES), config, CPU).model
    optimizers = Optimizers(model, config)
    assert list(optimizers) == ["dense", "embeddings"]
    optimizers.scale(0.5)
    optimizers.scale(0.5)  # twice: a schedule's factor is against the base, it does not compound
    assert optimizers.rates() == pytest.approx({"learning_rate": 0.005, "embedding_learning_rate": 0.1})


def test_the_optimisers_state_round_trips_into_fresh_ones():
    config = _config(dense_optimizer="adam")
    torch.manual_seed(0)
    model = build_mode(config.model_config(SIZES), config, CPU).model
    optimizers = Optimizers(model, config)
    dense = torch.randn(8, 13)
    sparse = torch.randint(0, 3, (8, 26))
    for _ in range(2):
        optimizers.zero_grad()
        model(dense, sparse).sum().backward()
        optimizers.step()
    fresh = Optimizers(model, config)
    fresh.load_state_dict(optimizers.state_dict())
    for name in optimizers:
        written, restored = optimizers[name].state_dict()["state"], fresh[name].state_dict()["state"]
        assert written.keys() == restored.keys() and written, name
        for key, values in written.items():
            for field, value in values.items():
                torch.testing.assert_close(restored[key][field], value, msg=f"{name} {key} {field}")


@pytest.mark.parametrize("name", ["adam", "adagrad", "sgd"])
def test_the_dense_optimiser_is_torch_s_fused_kernel_and_steps_as_the_plain_one_within_rounding(name):
    config = _config(dense_optimizer=name)
    torch.manual_seed(0)
    model = build_mode(config.model_config(SIZES), config, CPU).model
    fused = build_optimizers(model, config)["dense"]
    assert fused.defaults["fused"] is True
    parameters = [p.detach().clone().requires_grad_() for p in model.dense_parameters()]
    plain = type(fused)(parameters, **config.dense_optimizer_args())  # torch's loop over the tensors
    for _ in range(3):
        for mine, theirs in zip(model.dense_parameters(), parameters, strict=True):
            mine.grad = torch.randn_like(mine)
            theirs.grad = mine.grad.clone()
        fused.step()
        plain.step()
    for mine, theirs in zip(model.dense_parameters(), parameters, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)


def _row_gradient(generator: torch.Generator, rows: int, lookups: int, dim: int) -> torch.Tensor:
    """A lookup's sparse gradient as backward makes it: one entry per looked-up row, duplicates not summed."""
    indices = torch.randint(0, rows, (1, lookups), generator=generator)  # many repeats: rows << lookups
    return torch.sparse_coo_tensor(
        indices, torch.randn(lookups, dim, generator=generator), (rows, dim), check_invariants=True
    )


def test_summed_rows_sums_each_row_s_duplicates_as_coalesce_does():
    gradient = _row_gradient(torch.Generator().manual_seed(0), rows=7, lookups=40, dim=3)
    rows, values = summed_rows(gradient)
    reference = gradient.coalesce()
    assert torch.equal(rows, reference.indices()[0])
    torch.testing.assert_close(values, reference.values())
    assert summed_rows(reference)[1].data_ptr() == reference.values().data_ptr()  # already summed: taken as is


@pytest.mark.parametrize("maximize", [False, True])
def test_sparse_adam_steps_as_torch_s_within_rounding_and_shares_its_state(maximize):
    generator = torch.Generator().manual_seed(1)
    start = torch.randn(50, 4, generator=generator)
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    settings = {"lr": 0.05, "betas": (0.8, 0.95), "eps": 1e-6, "maximize": maximize}
    mine, reference = SparseAdam([ours], **settings), torch.optim.SparseAdam([theirs], **settings)
    for step in range(6):
        gradient = _row_gradient(generator, rows=50, lookups=80, dim=4)
        ours.grad = gradient if step % 2 else gradient.coalesce()  # a data-parallel exchange sums them already
        theirs.grad = gradient.clone()
        mine.step()
        reference.step()
    assert not torch.equal(ours, start)  # it moved
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-7)
    for field in ("exp_avg", "exp_avg_sq"):
        torch.testing.assert_close(mine.state[ours][field], reference.state[theirs][field], rtol=1e-6, atol=1e-9)
    assert mine.state[ours]["step"] == reference.state[theirs]["step"] == 6
    # Checkpoints written by either load into the other: the same state, the same keys.
    torch_state = reference.state_dict()
    restored = SparseAdam([torch.nn.Parameter(theirs.detach().clone())], **settings)
    restored.load_state_dict(torch_state)
    assert restored.state_dict()["state"].keys() == torch_state["state"].keys()
    assert restored.state_dict()["state"][0].keys() == torch_state["state"][0].keys()


def test_sparse_adam_refuses_a_dense_gradient_as_torch_s_does():
    parameter = torch.nn.Parameter(torch.zeros(3, 2))
    parameter.grad = torch.ones(3, 2)
    with pytest.raises(RuntimeError, match="sparse row gradients"):
        SparseAdam([parameter]).step()
