import pytest
import torch
from torch import nn

from criteo_dlrm.models import DCN, DLRM, DenseMLP, DLRMConfig
from criteo_dlrm.models.dlrm import ConfigError

TABLES = [3, 7, 50, 11, 2, 9, 100, 4, 5, 6, 8, 10, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25]


def _config(**overrides) -> DLRMConfig:
    values = {
        "table_sizes": TABLES,
        "sparse_embedding_sizes": [4] * 26,
        "dense_mlp": DenseMLP([8], 4),
        "prediction_hidden_sizes": [16],
        "prediction_dropout": 0.0,
        "interaction": "dot_cat",
        "dcn": DCN(),
        "multi_hot_sizes": None,
    }
    return DLRMConfig(**{**values, **overrides})


def _inputs(batch: int = 6, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    dense = torch.randn(batch, 13, generator=generator)
    sparse = torch.stack([torch.randint(0, size, (batch,), generator=generator) for size in TABLES], dim=1)
    return dense, sparse


@pytest.mark.parametrize("interaction", ["dot", "dot_cat"])
def test_dot_interactions_match_a_naive_double_loop(interaction):
    """The dense vector, the 351 upper-triangle dot products in (i, j) order, and with ``dot_cat`` every
    embedding after them in feature order, each read from its table row."""
    torch.manual_seed(0)
    model = DLRM(_config(interaction=interaction))
    dense, sparse = _inputs()
    x = model.dense_mlp(dense)
    result = model.interact(x, model.embed(sparse))
    table = model.embeddings[0].weight.weight
    starts = torch.tensor([0, *TABLES[:-1]]).cumsum(0)
    for b in range(len(dense)):
        vectors = [x[b]] + [table[starts[f] + sparse[b, f]] for f in range(26)]
        dots = [float(vectors[i] @ vectors[j]) for i in range(27) for j in range(i + 1, 27)]
        own = [float(v) for vector in vectors[1:] for v in vector] if interaction == "dot_cat" else []
        assert result[b, :4].tolist() == pytest.approx(x[b].tolist())
        assert result[b, 4:].tolist() == pytest.approx(dots + own, rel=1e-5, abs=1e-6)
    own_size = 26 * 4 if interaction == "dot_cat" else 0
    assert result.shape == (6, 4 + 351 + own_size) == (6, model.config.interaction_size)


@pytest.mark.parametrize("precision", ["float64", "bf16 autocast"])
def test_the_pairwise_dots_backward_is_autograd_s_of_the_plain_products(precision):
    """``PairwiseDots`` computes the upper triangle's gradient as one product, ``(G + G^T) V``: the same as autograd's
    through ``bmm`` and ``index_select`` (float64: to its rounding; bf16: within bf16's), in the vectors' dtype."""
    from criteo_dlrm.models.dlrm import PairwiseDots

    generator = torch.Generator().manual_seed(0)
    rows, cols = torch.triu_indices(27, 27, offset=1)
    upper, lower = rows * 27 + cols, cols * 27 + rows
    dtype = torch.float64 if precision == "float64" else torch.float32
    vectors = torch.randn(32, 27, 16, generator=generator, dtype=dtype, requires_grad=True)
    weights = torch.randn(32, 351, generator=generator, dtype=torch.float64)  # the loss: a weighted sum of the dots
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision != "float64"):
        dots = PairwiseDots.apply(vectors, upper, lower)
    (dots.double() * weights).sum().backward()

    exact = vectors.detach().double().requires_grad_()
    reference = torch.bmm(exact, exact.transpose(1, 2)).flatten(1)[:, upper]
    (reference * weights).sum().backward()
    assert vectors.grad.dtype == dtype
    if precision == "float64":
        torch.testing.assert_close(dots, reference, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(vectors.grad, exact.grad, rtol=1e-12, atol=1e-12)
    else:  # bf16 keeps 8 bits: each value within a few of its units in the last place of the largest
        scale = exact.grad.abs().max()
        assert (vectors.grad.double() - exact.grad).abs().max() < 2**-6 * scale
        assert (dots.double() - reference).abs().max() < 2**-6 * reference.abs().max()


def test_the_dot_interaction_trains_through_pairwise_dots_and_scores_through_plain_operations():
    """Training takes the one-product backward; without gradients or in evaluation (scoring, exports) the forward is
    plain ``bmm`` and ``index_select``, which every exporter knows."""
    torch.manual_seed(0)
    model = DLRM(_config(interaction="dot"))
    dense, sparse = _inputs()

    def nodes(output: torch.Tensor) -> set[str]:
        names, stack = set(), [output.grad_fn]
        while stack:
            node = stack.pop()
            if node is not None:
                names.add(node.name())
                stack.extend(next_node for next_node, _ in node.next_functions)
        return names

    trained = model(dense, sparse)
    assert any(name.startswith("PairwiseDots") for name in nodes(trained))
    with torch.no_grad():
        scored = model(dense, sparse)
    torch.testing.assert_close(scored, trained.detach(), rtol=0, atol=0)
    exported = model.eval()(dense, sparse)  # as torch.export and the ONNX exporter trace it: gradients on
    assert not any(name.startswith("PairwiseDots") for name in nodes(exported))
    torch.testing.assert_close(exported, trained, rtol=0, atol=0)


def test_fused_table_rows_belong_to_their_feature():
    model = DLRM(_config())
    dense, sparse = _inputs()
    embedded = model.embed(sparse)[0]
    weight = model.embeddings[0].weight.weight
    offsets = [0]
    for size in TABLES[:-1]:
        offsets.append(offsets[-1] + size)
    for f in range(26):
        torch.testing.assert_close(embedded[:, f], weight[offsets[f] + sparse[:, f]])


def test_forward_returns_one_logit_per_row_for_both_interactions():
    dense, sparse = _inputs(batch=5)
    assert DLRM(_config())(dense, sparse).shape == (5,)
    mixed = _config(interaction="cat", sparse_embedding_sizes=[2] * 10 + [6] * 16)
    model = DLRM(mixed)
    assert len(model.embeddings) == 2
    assert model(dense, sparse).shape == (5,)
    assert mixed.interaction_size == 4 + 2 * 10 + 6 * 16


def test_outputs_are_logits_not_probabilities():
    model = DLRM(_config())
    with torch.no_grad():
        model.prediction_mlp[-1].bias.fill_(5.0)
    logits = model(*_inputs())
    assert (logits > 1).all(), "no sigmoid inside the model"


def test_gradients_reach_every_table_and_are_sparse():
    model = DLRM(_config())
    dense, sparse = _inputs(batch=64)
    nn.BCEWithLogitsLoss()(model(dense, sparse), torch.ones(64)).backward()
    grad = model.embeddings[0].weight.weight.grad
    assert grad.is_sparse
    touched = set(grad.coalesce().indices()[0].tolist())
    offsets = torch.tensor([0, *TABLES[:-1]]).cumsum(0)
    for f in range(26):
        assert set((offsets[f] + sparse[:, f]).tolist()) <= touched
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.dense_parameters() if p.dim() > 1)


def test_a_tiny_batch_can_be_overfitted():
    torch.manual_seed(0)
    model = DLRM(_config(), sparse_gradients=False)
    dense, sparse = _inputs(batch=16, seed=3)
    labels = (torch.arange(16) % 3 == 0).float()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(300):
        optimizer.zero_grad()
        loss = nn.BCEWithLogitsLoss()(model(dense, sparse), labels)
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.01


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"interaction": "dot", "sparse_embedding_sizes": [8] * 26},
            r"interaction 'dot' needs every embedding size equal to dense_mlp.output_size \(4\)",
        ),
        (
            {"interaction": "dot_cat", "sparse_embedding_sizes": [8] * 26},
            r"interaction 'dot_cat' needs every embedding size equal to dense_mlp.output_size \(4\)",
        ),
        ({"sparse_embedding_sizes": [4] * 25}, "sparse_embedding_sizes has 25 entries for 26 features"),
        ({"interaction": "outer"}, "interaction must be one of"),
        ({"dense_mlp": DenseMLP([0], 4)}, "sizes must be positive"),
    ],
)
def test_inconsistent_settings_fail_with_what_to_change(overrides, message):
    with pytest.raises(ConfigError, match=message):
        _config(**overrides)


def _naive_dlrm_logits(model: DLRM, dense: torch.Tensor, sparse: torch.Tensor, interaction: str) -> list[float]:
    """The paper's DLRM written out row by row in float64 numpy, from the weights alone.

    Bottom MLP with a ReLU after every layer (its output is a feature vector like an embedding), one
    table per feature (rows at the feature's offset in the fused table, offsets summed here from
    ``TABLES``), the upper-triangle dot products in (i, j) order after the dense vector itself, and a top
    MLP with ReLU between layers and none after the logit.
    """
    import numpy as np

    def layers(sequential):
        return [(m.weight.detach().double().numpy(), m.bias.detach().double().numpy()) for m in sequential if isinstance(m, nn.Linear)]  # fmt: skip

    bottom, top = layers(model.dense_mlp), layers(model.prediction_mlp)
    table = model.embeddings[0].weight.weight.detach().double().numpy()
    starts = np.concatenate([[0], np.cumsum(TABLES)[:-1]])
    logits = []
    for row in range(len(dense)):
        x = dense[row].double().numpy()
        for weight, bias in bottom:
            x = np.maximum(weight @ x + bias, 0.0)
        vectors = [x] + [table[starts[f] + int(sparse[row, f])] for f in range(26)]
        if interaction in ("dot", "dot_cat"):
            pairs = [vectors[i] @ vectors[j] for i in range(27) for j in range(i + 1, 27)]
            z = np.concatenate([x, pairs] + (vectors[1:] if interaction == "dot_cat" else []))
        else:
            z = np.concatenate(vectors)
        if interaction == "dcn":  # DCN-v2, low rank: x_{l+1} = x_0 * (W_l V_l x_l + b_l) + x_l
            z0 = z
            for down, up in zip(model.interaction.cross.down, model.interaction.cross.up, strict=True):
                v = down.weight.detach().double().numpy()
                w, b = up.weight.detach().double().numpy(), up.bias.detach().double().numpy()
                z = z0 * (w @ (v @ z) + b) + z
        for k, (weight, bias) in enumerate(top):
            z = weight @ z + bias
            if k < len(top) - 1:
                z = np.maximum(z, 0.0)
        logits.append(float(z[0]))
    return logits


@pytest.mark.parametrize("interaction", ["dot", "dot_cat", "cat", "dcn"])
def test_whole_forward_pass_matches_a_naive_float64_dlrm(interaction):
    torch.manual_seed(3)
    config = _config(
        dense_mlp=DenseMLP([8, 6], 4), prediction_hidden_sizes=[16, 8], interaction=interaction, dcn=DCN(2, 5)
    )
    model = DLRM(config)
    if interaction == "dcn":  # weights larger than the default initialisation make every cross term count
        with torch.no_grad():
            for up in model.interaction.cross.up:
                up.weight.normal_(0, 0.3), up.bias.normal_(0, 0.3)
    model = model.double().eval()
    dense, sparse = _inputs(batch=16, seed=5)
    logits = model(dense.double(), sparse)
    assert logits.tolist() == pytest.approx(_naive_dlrm_logits(model, dense, sparse, interaction), rel=1e-10, abs=1e-12)


def test_prediction_dropout_acts_in_training_only_and_keeps_the_weights_layout():
    torch.manual_seed(3)
    plain = DLRM(_config())
    torch.manual_seed(3)
    dropped = DLRM(_config(prediction_dropout=0.5))
    assert not any(isinstance(m, nn.Dropout) for m in plain.modules()), "no Dropout module at 0"
    assert sum(isinstance(m, nn.Dropout) for m in dropped.prediction_mlp) == len(_config().prediction_hidden_sizes)
    for (name, weight), (_, same) in zip(
        plain.prediction_mlp.named_parameters(), dropped.prediction_mlp.named_parameters(), strict=True
    ):
        assert torch.equal(weight, same), name  # the same layers, initialised alike
    dense, sparse = _inputs()
    plain.eval(), dropped.eval()
    torch.testing.assert_close(dropped(dense, sparse), plain(dense, sparse))
    dropped.train()
    assert not torch.allclose(dropped(dense, sparse), plain(dense, sparse))
    with pytest.raises(ConfigError, match="prediction_dropout"):
        _config(prediction_dropout=1.0)


def test_the_model_s_sizes_have_one_home_the_training_config():
    """DLRMConfig has no defaults for what parameters_training.yml sets: a default changed there cannot leave
    a second, different one here (benchmarks once built models the new defaults refused)."""
    import dataclasses

    from criteo_dlrm.config.training import TrainingConfig

    yaml_names = {f.name for f in dataclasses.fields(TrainingConfig)}
    for f in dataclasses.fields(DLRMConfig):
        if f.name in yaml_names:
            assert f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING, f.name
    assert {f.name for f in dataclasses.fields(DLRMConfig)} - yaml_names == {
        "table_sizes", "dense_in_features", "initial_ctr"
    }  # fmt: skip


def test_a_format_1_model_config_without_the_later_fields_builds_the_model_it_was():
    flat = {"table_sizes": TABLES, "embedding_dims": [4] * 26, "dense_hidden_sizes": [8], "dense_output_size": 4,
            "prediction_hidden_sizes": [16], "interaction": "dot"}  # fmt: skip
    config = DLRMConfig.from_dict(flat)
    assert (config.prediction_dropout, config.dcn, config.interaction) == (0.0, DCN(3, 64), "dot")
    assert config == _config(interaction="dot")


def test_dcn_s_cross_layers_start_as_the_mlperf_reference_s_when_asked():
    """Issue 47 item 5: MLPerf's DLRM-DCNv2 initialises the cross layers xavier_normal with zero biases."""
    torch.manual_seed(0)
    model = DLRM(_config(interaction="dcn", dcn=DCN(num_layers=2, low_rank=16, init="xavier_normal")))
    for layer in [*model.interaction.cross.down, *model.interaction.cross.up]:
        fan_out, fan_in = layer.weight.shape
        wanted = (2 / (fan_in + fan_out)) ** 0.5  # xavier_normal's standard deviation
        assert abs(layer.weight.std().item() / wanted - 1) < 0.1 and abs(layer.weight.mean().item()) < 0.1 * wanted
    assert all(torch.equal(up.bias, torch.zeros_like(up.bias)) for up in model.interaction.cross.up)
    default = DLRM(_config(interaction="dcn", dcn=DCN(num_layers=2, low_rank=16)))
    assert all(up.bias.abs().sum() > 0 for up in default.interaction.cross.up), "torch's default: uniform biases"
    with pytest.raises(ConfigError, match="dcn.init must be one of"):
        _config(interaction="dcn", dcn=DCN(init="glorot"))


def test_a_dcn_model_stores_its_cross_weights_under_the_names_checkpoints_have_always_held():
    torch.manual_seed(0)
    model = DLRM(_config(interaction="dcn"))
    state = model.state_dict()
    assert {k for k in state if "cross" in k} == {
        f"cross.{side}.{i}.weight" for side in ("down", "up") for i in range(3)
    } | {f"cross.up.{i}.bias" for i in range(3)}
    fresh = DLRM(_config(interaction="dcn"))
    fresh.load_state_dict(state)  # strict: every name found
    assert torch.equal(fresh.interaction.cross.up[2].bias, model.interaction.cross.up[2].bias)
    wrapped = torch.nn.ModuleDict({"model": model}).state_dict()  # a parent's prefix (DDP's module., DMP's)
    assert "model.cross.down.0.weight" in wrapped and not any("interaction" in k for k in wrapped)


def test_every_interaction_is_one_class_whose_output_width_is_what_the_prediction_mlp_takes():
    from criteo_dlrm.models.dlrm import INTERACTIONS

    dense, sparse = _inputs()
    for name, kind in INTERACTIONS.items():
        dims = [4] * 26 if name in ("dot", "dot_cat") else [2] * 10 + [6] * 16
        model = DLRM(_config(interaction=name, sparse_embedding_sizes=dims))
        assert type(model.interaction) is kind
        out = model.interact(model.dense_mlp(dense), model.embed(sparse))
        assert out.shape == (len(dense), model.config.interaction_size)
        assert model.config.interaction_size == model.prediction_mlp[0].in_features
