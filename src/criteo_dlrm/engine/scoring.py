"""Scoring typed Parquet days with a trained model and its own encoder, in bounded memory."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from criteo_dlrm.data.batches import Batch
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.metadata import vocabulary_digest
from criteo_dlrm.data.parquet import count_rows, iter_batches
from criteo_dlrm.engine.device import autocast
from criteo_dlrm.errors import DataError
from criteo_dlrm.progress import progress_bar
from criteo_dlrm.schema import SPARSE_COLUMNS


class VocabularyMismatchError(DataError):
    """The encoder's vocabularies are not the ones the checkpoint was trained with."""


def check_encoder(encoder: FeatureEncoder, expected_sha256: str, source: str) -> None:
    """Refuse to score with vocabularies other than the training ones (that would silently mis-encode)."""
    if encoder.vocabularies is None:
        actual = vocabulary_digest({name: np.zeros(0, dtype=np.int64) for name in SPARSE_COLUMNS})
    else:
        actual = vocabulary_digest(dict(zip(SPARSE_COLUMNS, encoder.vocabularies, strict=True)))
    if actual != expected_sha256:
        raise VocabularyMismatchError(
            f"{source}: its vocabularies (sha256 {actual[:12]}...) are not the ones it was trained with "
            f"({expected_sha256[:12]}...). The checkpoint is damaged or was edited; retrain it."
        )


@torch.no_grad()
def score_days(
    model: torch.nn.Module,
    encoder: FeatureEncoder,
    paths: Sequence[str | Path],
    device: torch.device,
    precision: str = "fp32",
    progress: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Encode and score each Parquet batch in turn.

    Only the labels and predictions (5 bytes per row) are kept, so memory grows by that much and no more.

    Returns:
        ``(labels int8 (N,), click probabilities float32 (N,))`` in file order.
    """
    model = model.to(device).eval()
    labels, predictions = [], []
    with progress_bar(count_rows(paths), "scoring", "rows", progress) as bar:
        for record_batch in iter_batches(paths):
            encoded = encoder.encode_batch(record_batch)
            batch = Batch(
                torch.from_numpy(encoded.labels),
                torch.from_numpy(encoded.dense),
                torch.from_numpy(encoded.sparse.astype(np.int64)),
            ).to(device, non_blocking=True)
            with autocast(device, precision):
                logits = model(batch.dense, batch.sparse)
            predictions.append(torch.sigmoid(logits.float()).cpu().numpy())
            labels.append(encoded.labels.astype(np.int8))
            bar.update(len(encoded))
    return np.concatenate(labels), np.concatenate(predictions)
