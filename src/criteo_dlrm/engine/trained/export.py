"""Exporting a trained DLRM for serving: ONNX (checked with onnxruntime), ``torch.export`` and the encoder.

The exported graph takes the encoded inputs and returns calibrated click probabilities and the raw logits:

- ``dense``: (B, 13) float32, ``(log1p(max(x, 0)) - dense_mean) / dense_std``, 0 where the count is missing;
- ``sparse``: (B, 26) int64, ``first_row + position of the value in its feature's vocabulary``,
  ``unseen_row`` when the vocabulary does not hold it, ``missing_row`` when missing (or ``first_row + value mod
  (table_size - first_row)`` in modulus-hash mode); the serving encoder records the three;
- ``probability``: (B,) float32, the checkpoint's calibration applied (``engine.trained.calibration``);
- ``logit``: (B,) float32, the model's output before calibration.

``serving_encoder`` writes what that preprocessing needs into one ``.npz`` (see ``ENCODER_FORMAT``), so a
serving system reproduces raw row -> probability without this package.
"""

from __future__ import annotations

import io
import logging
import warnings

import numpy as np
import torch
from loguru import logger
from torch import nn

from criteo_dlrm.common.errors import UserError
from criteo_dlrm.common.schema import NUM_DENSE, NUM_SPARSE, SPARSE_COLUMNS
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.feature_metadata import MISSING_ROW, OUT_OF_VOCABULARY_ROW
from criteo_dlrm.engine.trained.calibration import Calibrator, Identity

INPUT_NAMES = ["dense", "sparse"]
OUTPUT_NAMES = ["probability", "logit"]
ENCODER_FORMAT = (
    "npz: table_sizes int64 (26,), dense_mean float64 (13,), dense_std float64 (13,), dense_offset int64 (13,), "
    "dense_missing float64 (13,), modulus_hash bool (), "
    "unseen_row int64 () (0), missing_row int64 () (1; 0 for checkpoints made before missing values had a row "
    "of their own), first_row int64 () (2, or 1 before), and SPARSE_0 .. SPARSE_25 int64 vocabularies (entry i "
    "is table index first_row + i; empty in modulus-hash mode)"
)


class ExportError(UserError, RuntimeError):
    """The exported model does not reproduce the PyTorch model's probabilities."""


class ScoringModel(nn.Module):
    """A DLRM and its calibration: the function a serving system calls."""

    def __init__(self, model: nn.Module, calibration: Calibrator | None = None):
        super().__init__()
        self.model = model
        self.calibration = calibration if calibration is not None else Identity()

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """dense: (B, 13) float32; sparse: (B, 26) int64 -> ((B,) calibrated probabilities, (B,) logits)."""
        logits = self.model(dense, sparse)
        return self.calibration(logits), logits


def scoring_model(model: nn.Module) -> ScoringModel:
    """``model`` itself when it is a ``ScoringModel``, else the DLRM with no calibration (its own probabilities)."""
    return model if isinstance(model, ScoringModel) else ScoringModel(model)


def example_inputs(table_sizes: list[int], rows: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic encoded inputs covering every table: dense (rows, 13), sparse (rows, 26) indices."""
    generator = torch.Generator().manual_seed(seed)
    dense = torch.randn(rows, NUM_DENSE, generator=generator)
    sparse = torch.stack([torch.randint(0, size, (rows,), generator=generator) for size in table_sizes], dim=1)
    return dense, sparse


def _dynamic_batch() -> dict:
    batch = torch.export.Dim("batch")
    return {"dense": {0: batch}, "sparse": {0: batch}}


def export_onnx(model: nn.Module, table_sizes: list[int]) -> bytes:
    """ONNX bytes of ``scoring_model(model)`` with a dynamic batch dimension (torch.onnx's dynamo exporter)."""
    scoring = scoring_model(model).eval()
    # The exporter notes, for every run, that torchvision's operators are not there: nothing this model uses.
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            scoring,
            example_inputs(table_sizes, 8),
            dynamo=True,
            dynamic_shapes=_dynamic_batch(),
            input_names=INPUT_NAMES,
            output_names=OUTPUT_NAMES,
            verbose=False,
        )
    registration.setLevel(level)
    buffer = io.BytesIO()
    program.save(buffer)
    return buffer.getvalue()


def export_program(model: nn.Module, table_sizes: list[int]) -> bytes:
    """``torch.export`` of ``scoring_model(model)`` (a ``.pt2``, loaded with ``torch.export.load``)."""
    program = torch.export.export(
        scoring_model(model).eval(), example_inputs(table_sizes, 8), dynamic_shapes=_dynamic_batch()
    )
    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    return buffer.getvalue()


def onnx_max_difference(onnx_model: bytes, model: nn.Module, dense: torch.Tensor, sparse: torch.Tensor) -> float:
    """Largest |onnxruntime - PyTorch| over the given rows and both outputs (probability, logit), on the CPU."""
    import onnxruntime

    session = onnxruntime.InferenceSession(onnx_model, providers=["CPUExecutionProvider"])
    exported = session.run(OUTPUT_NAMES, {"dense": dense.numpy(), "sparse": sparse.numpy()})
    with torch.no_grad():
        expected = [output.numpy() for output in scoring_model(model).eval()(dense, sparse)]
    return max(float(np.abs(a - b).max()) for a, b in zip(exported, expected, strict=True))


def check_onnx(onnx_model: bytes, model: nn.Module, table_sizes: list[int], rows: int, tolerance: float) -> dict:
    """Compare onnxruntime with PyTorch on ``rows`` rows and on batches of 1 and 7 (the batch is dynamic).

    Raises:
        ExportError: a difference above ``tolerance``.
    """
    differences = {}
    for batch in (rows, 1, 7):
        dense, sparse = example_inputs(table_sizes, batch, seed=batch)
        differences[batch] = onnx_max_difference(onnx_model, model, dense, sparse)
    worst = max(differences.values())
    if worst > tolerance:
        raise ExportError(
            f"onnxruntime's outputs differ from PyTorch's by up to {worst:.2e} (tolerance {tolerance:.0e}): "
            "the ONNX export is not faithful; report it with your torch and onnxruntime versions."
        )
    logger.info("ONNX export checked with onnxruntime: max |difference| {:.2e} over {:,} rows", worst, rows)
    return {"rows": rows, "batch_sizes": list(differences), "max_abs_difference": worst, "tolerance": tolerance}


def serving_encoder(encoder: FeatureEncoder) -> bytes:
    """The encoder as one ``.npz`` in the documented ``ENCODER_FORMAT``."""
    vocabularies = encoder.vocabularies or [np.zeros(0, dtype=np.int64)] * NUM_SPARSE
    buffer = io.BytesIO()
    np.savez(
        buffer,
        table_sizes=np.asarray(encoder.table_sizes, dtype=np.int64),
        dense_mean=encoder.dense_mean,
        dense_std=encoder.dense_std,
        dense_offset=encoder.dense_offset,
        dense_missing=encoder.dense_missing,
        modulus_hash=np.asarray(encoder.use_modulus_hash),
        unseen_row=np.asarray(OUT_OF_VOCABULARY_ROW, dtype=np.int64),
        missing_row=np.asarray(MISSING_ROW if encoder.missing_row else OUT_OF_VOCABULARY_ROW, dtype=np.int64),
        first_row=np.asarray(encoder.first_vocabulary_row, dtype=np.int64),
        **{name: np.asarray(values, dtype=np.int64) for name, values in zip(SPARSE_COLUMNS, vocabularies, strict=True)},
    )
    return buffer.getvalue()
