"""The torchrec embedding backend computes the torch backend's model (needs the torchrec extra; CI installs it)."""

import pytest
import torch

from criteo_dlrm.models.dlrm import DLRM, DLRMConfig
from criteo_dlrm.models.torchrec_embeddings import grouped_tables, split_tables, table_key
from tests.conftest import tiny_model_config

pytest.importorskip("torchrec", reason="the torchrec extra is not installed (docs/torchrec.md: Install)")

from criteo_dlrm.models.torchrec_embeddings import TorchRecEmbeddings  # noqa: E402

NAMES = [f"T{f}" for f in range(26)]


def _config(interaction: str, dims: list[int]) -> DLRMConfig:
    sizes = [3 + 7 * f for f in range(26)]
    return tiny_model_config(sizes, sparse_embedding_sizes=dims, interaction=interaction)


def _torchrec_copy(model: DLRM) -> DLRM:
    """The same weights in a DLRM whose tables are a TorchRec collection (unsharded, on the CPU)."""
    config = model.config
    copy = DLRM(config, embeddings=TorchRecEmbeddings(config, NAMES, device="cpu"))
    state = dict(model.state_dict())
    tables = split_tables(state, config)
    for g in range(len(model.embeddings)):
        del state[f"embeddings.{g}.weight.weight"]
    state.update({table_key(NAMES[f]): table for f, table in tables.items()})
    copy.load_state_dict(state)
    return copy.eval()


@pytest.mark.parametrize(
    ("interaction", "dims"),
    [("dot", [8] * 26), ("dot_cat", [8] * 26), ("cat", [4, 8] * 13), ("dcn", [8] * 20 + [4] * 6)],
)
def test_torchrec_tables_give_the_same_logits_for_the_same_weights(interaction, dims):
    torch.manual_seed(0)
    model = DLRM(_config(interaction, dims)).eval()
    generator = torch.Generator().manual_seed(1)
    dense = torch.randn(64, 13, generator=generator)
    sparse = torch.stack([torch.randint(0, size, (64,), generator=generator) for size in model.config.table_sizes], 1)
    expected = model(dense, sparse)
    torch.testing.assert_close(_torchrec_copy(model)(dense, sparse), expected, rtol=1e-5, atol=1e-6)
    # A table mix-up (features in another order) would not pass: shuffle two tables' weights.
    swapped = _torchrec_copy(model)
    weights = swapped.embeddings.collection.embedding_bags
    with torch.no_grad():
        weights["T0"].weight.copy_(torch.flip(weights["T0"].weight, [0]))
    assert not torch.allclose(swapped(dense, sparse), expected)


def test_grouped_and_split_tables_are_inverse():
    config = _config("cat", [4, 8] * 13)
    state = DLRM(config).state_dict()
    tables = split_tables(state, config)
    assert [tables[f].shape for f in range(26)] == [
        (rows, dim) for rows, dim in zip(config.table_sizes, config.sparse_embedding_sizes, strict=True)
    ]
    regrouped = grouped_tables(tables, config)
    for key, tensor in regrouped.items():
        torch.testing.assert_close(tensor, state[key], rtol=0, atol=0)
