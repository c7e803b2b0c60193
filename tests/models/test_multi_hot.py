"""Multi-hot features (issue 47 item 1): MLPerf's expansion rule, and models that sum each feature's rows, against a
naive reference (per feature, per id, the sum of its rows) on both embedding backends and every interaction."""

import importlib.util

import numpy as np
import pytest
import torch

from criteo_dlrm.models.dlrm import DLRM, embedding_groups
from criteo_dlrm.models.multi_hot import MultiHot
from criteo_dlrm.models.torchrec_embeddings import split_tables, table_key
from tests.conftest import tiny_model_config

MLPERF_SIZES = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
TABLES = [3 + 7 * f for f in range(26)]


def _indices(rows: int, tables: list[int], seed: int = 3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randint(0, n, (rows,), generator=generator) for n in tables], dim=1)


def test_each_value_looks_up_its_own_row_first_then_ids_of_its_table_the_same_every_time():
    expand = MultiHot(TABLES, MLPERF_SIZES)
    sparse = _indices(500, TABLES)
    bags = expand(sparse)
    assert [bag.shape for bag in bags] == [(500, k) for k in MLPERF_SIZES] and sum(bag.shape[1] for bag in bags) == 214
    for f, bag in enumerate(bags):
        assert torch.equal(bag[:, 0], sparse[:, f]), "a value's own row first"
        assert bag.min() >= 0 and bag.max() < TABLES[f], "ids within the feature's table"
    again = MultiHot(TABLES, MLPERF_SIZES)(sparse.flip(0))
    assert all(torch.equal(a, b.flip(0)) for a, b in zip(bags, again, strict=True)), "a function of the value alone"
    other_seed = MultiHot(TABLES, MLPERF_SIZES, seed=1)(sparse)
    assert not torch.equal(bags[20], other_seed[20]), "the seed decides the draws"


def test_the_drawn_ids_are_uniform_over_the_table_and_unrelated_to_the_value():
    """Every value of a 50-row table with 100 lookups: 4,950 draws, a chi-square test of uniformity at 0.1% (df 49:
    85.35), and the draws of two neighbouring values agree as often as chance has it."""
    rows = 50
    expand = MultiHot([rows] * 26, [100] + [1] * 25)
    values = torch.arange(rows).unsqueeze(1).expand(rows, 26)
    drawn = expand(values)[0][:, 1:]
    counts = np.bincount(drawn.reshape(-1).numpy(), minlength=rows)
    expected = drawn.numel() / rows
    assert ((counts - expected) ** 2 / expected).sum() < 85.35
    same = (drawn[1:] == drawn[:-1]).float().mean().item()
    assert same < 3 / rows, f"neighbouring values draw the same id {same:.3f} of the time (chance: {1 / rows})"


def _naive_embeddings(model: DLRM, sparse: torch.Tensor) -> list[torch.Tensor]:
    """Per feature, per row, the sum of its bag's rows, read from the torch backend's tables one id at a time."""
    config = model.config
    tables = split_tables(model.state_dict(), config)
    bags = MultiHot(config.table_sizes, config.multi_hot_sizes)(sparse)
    vectors = {
        f: torch.stack([sum(tables[f][int(i)] for i in bags[f][b]) for b in range(len(sparse))])
        for f in range(len(config.table_sizes))
    }
    return [torch.stack([vectors[f] for f in group], dim=1) for group in embedding_groups(config)]


INTERACTIONS = [("dot", [8] * 26), ("dot_cat", [8] * 26), ("cat", [4, 8] * 13), ("dcn", [8] * 20 + [4] * 6)]


def _model(interaction: str = "dot_cat", dims: int | list[int] = 8, **kwargs) -> DLRM:
    """The tests' small model with MLPerf's multi-hot sizes, built with seed 0."""
    torch.manual_seed(0)
    config = tiny_model_config(TABLES, sparse_embedding_sizes=dims, interaction=interaction,
                               multi_hot_sizes=MLPERF_SIZES)  # fmt: skip
    return DLRM(config, **kwargs)


@pytest.mark.parametrize(("interaction", "dims"), INTERACTIONS)
def test_a_multi_hot_model_sums_each_feature_s_rows(interaction, dims):
    model = _model(interaction, dims).eval()
    dense, sparse = torch.randn(6, 13), _indices(6, TABLES)
    with torch.no_grad():
        expected = model.prediction_mlp(model.interact(model.dense_mlp(dense), _naive_embeddings(model, sparse)))
        torch.testing.assert_close(model(dense, sparse), expected.squeeze(1), rtol=1e-5, atol=1e-6)


def test_a_multi_hot_model_s_sparse_gradients_reach_every_id_of_each_bag():
    model = _model(sparse_gradients=True)
    sparse = _indices(4, TABLES)
    model(torch.randn(4, 13), sparse).sum().backward()
    gradient = model.embeddings[0].weight.weight.grad.coalesce()
    offsets = [sum(TABLES[:f]) for f in range(26)]
    bags = MultiHot(TABLES, MLPERF_SIZES)(sparse)
    touched = {offsets[f] + int(i) for f, bag in enumerate(bags) for i in bag.reshape(-1)}
    assert set(gradient.indices()[0].tolist()) == touched


@pytest.mark.skipif(importlib.util.find_spec("torchrec") is None, reason="the torchrec extra is not installed")
@pytest.mark.parametrize(("interaction", "dims"), INTERACTIONS)
def test_torchrec_s_bags_give_the_torch_backend_s_logits(interaction, dims):
    from criteo_dlrm.models.torchrec_embeddings import TorchRecEmbeddings

    model = _model(interaction, dims).eval()
    config = model.config
    names = [f"T{f}" for f in range(26)]
    copy = DLRM(config, embeddings=TorchRecEmbeddings(config, names, device="cpu"))
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("embeddings.")}
    state |= {table_key(names[f]): table for f, table in split_tables(model.state_dict(), config).items()}
    copy.load_state_dict(state)
    dense, sparse = torch.randn(6, 13), _indices(6, TABLES)
    with torch.no_grad():
        torch.testing.assert_close(copy.eval()(dense, sparse), model(dense, sparse), rtol=1e-5, atol=1e-6)
