import io

import numpy as np
import onnxruntime
import pytest
import torch

from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.engine.trained.calibration import calibrator, from_state
from criteo_dlrm.engine.trained.export import (
    ExportError,
    ScoringModel,
    check_onnx,
    example_inputs,
    export_onnx,
    export_program,
    serving_encoder,
)
from criteo_dlrm.models import DLRM
from tests.conftest import tiny_model_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    sizes = [3, 50, 1000, 7] + [20] * 22
    config = tiny_model_config(sizes, prediction_hidden_sizes=[32, 16])
    return DLRM(config).eval()


@pytest.fixture(scope="module")
def onnx_model(model):
    return export_onnx(model, model.config.table_sizes)


@pytest.mark.parametrize("rows", [1, 7, 3000])
def test_onnxruntime_gives_pytorchs_probabilities_at_any_batch_size(model, onnx_model, rows):
    session = onnxruntime.InferenceSession(onnx_model, providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["dense", "sparse"]
    dense, sparse = example_inputs(model.config.table_sizes, rows, seed=rows + 100)
    exported, logits = session.run(["probability", "logit"], {"dense": dense.numpy(), "sparse": sparse.numpy()})
    with torch.no_grad():
        expected = torch.sigmoid(model(dense, sparse)).numpy()
        np.testing.assert_allclose(logits, model(dense, sparse).numpy(), atol=1e-5)
    difference = np.abs(exported - expected).max()
    print(f"onnxruntime vs PyTorch, {rows} rows: max |difference| {difference:.2e}")  # noqa: T201 - reported
    assert exported.shape == (rows,) and difference <= 1e-5


def test_the_export_check_reports_its_difference_and_refuses_an_unfaithful_model(model, onnx_model):
    report = check_onnx(onnx_model, model, model.config.table_sizes, rows=2048, tolerance=1e-5)
    assert report["rows"] == 2048 and 0 <= report["max_abs_difference"] <= 1e-5
    other = DLRM(model.config).eval()  # other weights: the exported file no longer matches
    with pytest.raises(ExportError, match="differ from PyTorch's by up to"):
        check_onnx(onnx_model, other, model.config.table_sizes, rows=256, tolerance=1e-5)


def test_torch_export_program_loads_and_matches(model):
    program = torch.export.load(io.BytesIO(export_program(model, model.config.table_sizes)))
    dense, sparse = example_inputs(model.config.table_sizes, 33, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(dense, sparse), ScoringModel(model)(dense, sparse))


@pytest.mark.parametrize("method", ["platt", "isotonic"])
def test_the_onnx_graph_applies_the_calibration_as_numpy_does(model, method):
    dense, sparse = example_inputs(model.config.table_sizes, 500, seed=9)
    with torch.no_grad():
        logits = model(dense, sparse).numpy().astype(np.float64)
    labels = (np.random.default_rng(0).random(500) < 1 / (1 + np.exp(-(1.5 * logits + 0.3)))).astype(np.int8)
    state = calibrator(method).fit(labels, logits).state()
    onnx_model = export_onnx(ScoringModel(model, from_state(state)), model.config.table_sizes)
    session = onnxruntime.InferenceSession(onnx_model, providers=["CPUExecutionProvider"])
    probability, logit = session.run(["probability", "logit"], {"dense": dense.numpy(), "sparse": sparse.numpy()})
    if method == "platt":
        expected = 1 / (1 + np.exp(-(state["slope"] * logits + state["intercept"])))
    else:  # linear between the knots, flat beyond them: numpy's interp
        expected = np.interp(logits, state["knots_logit"].numpy(), state["knots_probability"].numpy())
    np.testing.assert_allclose(logit, logits, atol=1e-5)
    np.testing.assert_allclose(probability, expected, atol=1e-5)
    assert check_onnx(onnx_model, ScoringModel(model, from_state(state)), model.config.table_sizes, 64, 1e-5)


def test_serving_encoder_holds_what_preprocessing_needs():
    vocabularies = [np.array([10 + f, 5, 7], dtype=np.int64) for f in range(26)]
    encoder = FeatureEncoder([4] * 26, np.arange(13) / 10, np.ones(13) * 2, vocabularies)
    stored = np.load(io.BytesIO(serving_encoder(encoder)))
    assert stored["table_sizes"].tolist() == [4] * 26 and not stored["modulus_hash"]
    np.testing.assert_array_equal(stored["dense_mean"], np.arange(13) / 10)
    assert stored["SPARSE_3"].tolist() == [13, 5, 7]


def test_a_multi_hot_model_exports_its_expansion_and_onnxruntime_keeps_up():
    """Issue 47 item 1: the exports take single-hot indices and expand them as the model does (the serving
    encoder's output stays as it is). ONNX's embedding_bag is a loop over the bags (4,096 rows of MLPerf's model took
    97 s in onnxruntime); the exported graph sums gathered rows instead, with no loop (0.2 s)."""
    import onnx

    torch.manual_seed(0)
    sizes = [3, 50, 1000, 7] + [20] * 22
    config = tiny_model_config(sizes, interaction="dcn")
    config.multi_hot_sizes = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
    model = DLRM(config).eval()
    exported = export_onnx(model, sizes)
    graph = onnx.load_from_string(exported)
    operators = {node.op_type for node in graph.graph.node} | {n.op_type for f in graph.functions for n in f.node}
    assert "Loop" not in operators and "Gather" in operators
    assert check_onnx(exported, model, sizes, rows=4096, tolerance=1e-5)["max_abs_difference"] <= 1e-5
    program = torch.export.load(io.BytesIO(export_program(model, sizes)))
    dense, sparse = example_inputs(sizes, 33, seed=3)
    with torch.no_grad():
        torch.testing.assert_close(program.module()(dense, sparse), ScoringModel(model)(dense, sparse))
