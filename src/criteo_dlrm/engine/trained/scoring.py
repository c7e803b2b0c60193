"""Scoring with a trained model and its own encoder: one home for turning rows into click probabilities.

``logits`` is the only place a model scores rows: training's validation (``predict``, over encoded rows, the
model's own probabilities), evaluation (``score_days``) and batch scoring (``write_predictions``, streaming to
Parquet) all call it; evaluation and batch scoring turn the logits into probabilities through the checkpoint's
calibration (``engine.trained.calibration``, ``calibrated``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

from criteo_dlrm.common.errors import DataError
from criteo_dlrm.common.progress import progress_bar
from criteo_dlrm.common.schema import FEATURE_COLUMNS, LABEL_COLUMN, LINE_COLUMN, SPARSE_COLUMNS
from criteo_dlrm.common.storage import create_exclusive, disk_full_error, is_disk_full
from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.feature_metadata import MISSING_ROW, OUT_OF_VOCABULARY_ROW, vocabulary_digest
from criteo_dlrm.data.parquet import Day, count_rows, iter_batches, open_day
from criteo_dlrm.engine.device import Runtime
from criteo_dlrm.engine.trained.calibration import Calibrator

CPU = Runtime()  # scoring's default: the CPU, fp32

PREDICTION_COLUMN = "click_probability"
LOGIT_COLUMN = "logit"
# Rows per forward pass when scoring. On the CPU a DLRM scores about 2.5x faster in slices of a few thousand
# rows than in whole Parquet batches (262,144 rows), whose (B, 27, 27) products no longer fit in cache.
MODEL_BATCH_ROWS = 4096
# Rows read, encoded and scored at a time. With the readers' 262,144, glibc's allocator kept the freed
# per-batch arrays (several of 2-27 MB: above its default threshold, its mmap threshold had risen to them) and
# evaluation grew to 2.0-2.9 GB on 1.3M test rows, the job's largest stage (killed in a 2 GB memory group);
# with 65,536 it peaks at about 1.0 GB, at the same speed.
SCORING_BATCH_ROWS = 1 << 16


class VocabularyMismatchError(DataError):
    """The encoder's vocabularies are not the ones the checkpoint was trained with."""


def checked_encoder(state: dict, expected_sha256: str, source: str) -> FeatureEncoder:
    """The encoder a checkpoint stored (``state``), after checking that its vocabularies are the ones it was
    trained with (``expected_sha256``; other vocabularies would silently mis-encode every row).

    Raises:
        VocabularyMismatchError: naming ``source`` (e.g. ``dlrm_checkpoint version ...``).
    """
    encoder = FeatureEncoder.from_state_dict(state)
    if encoder.vocabularies is None:
        actual = vocabulary_digest({name: np.zeros(0, dtype=np.int64) for name in SPARSE_COLUMNS})
    else:
        actual = vocabulary_digest(dict(zip(SPARSE_COLUMNS, encoder.vocabularies, strict=True)))
    if actual != expected_sha256:
        raise VocabularyMismatchError(
            f"{source}: its vocabularies (sha256 {actual[:12]}...) are not the ones it was trained with "
            f"({expected_sha256[:12]}...). The checkpoint is damaged or was edited; retrain it."
        )
    return encoder


@torch.no_grad()
def logits(
    model: torch.nn.Module,
    dense: torch.Tensor,
    sparse: torch.Tensor,
    runtime: Runtime = CPU,
    on_device: bool = False,
) -> torch.Tensor:
    """dense: (B, 13) float32, sparse: (B, 26) int64 table indices -> (B,) float32 logits on the CPU (on
    the runtime's device with ``on_device``)."""
    device = runtime.device
    dense, sparse = dense.to(device, non_blocking=True), sparse.to(device, non_blocking=True)
    with runtime.autocast():
        scores = model(dense, sparse)
    return scores.float() if on_device else scores.float().cpu()


def probabilities(
    model: torch.nn.Module,
    dense: torch.Tensor,
    sparse: torch.Tensor,
    runtime: Runtime = CPU,
    on_device: bool = False,
) -> torch.Tensor:
    """The model's own click probabilities (before calibration): ``sigmoid(logits(...))``, (B,) float32."""
    return torch.sigmoid(logits(model, dense, sparse, runtime, on_device))


@torch.no_grad()
def calibrated(calibration: Calibrator, scores: np.ndarray) -> np.ndarray:
    """logits (N,) float32 -> calibrated click probabilities (N,) float32, a slice at a time (an isotonic
    calibration holds a (rows, knots) matrix while it runs)."""
    calibration = calibration.cpu().eval()
    parts = [
        calibration(torch.from_numpy(np.ascontiguousarray(scores[begin : begin + MODEL_BATCH_ROWS]))).numpy()
        for begin in range(0, len(scores), MODEL_BATCH_ROWS)
    ]
    return np.concatenate(parts).astype(np.float32) if parts else np.zeros(0, np.float32)


def score_batches(
    model: torch.nn.Module,
    encoder: FeatureEncoder,
    batches: Iterable[pa.RecordBatch],
    runtime: Runtime = CPU,
    seen: dict[str, int] | None = None,
) -> Iterator[tuple[pa.RecordBatch, np.ndarray]]:
    """Encode and score typed record batches one at a time: yields ``(batch, logits float32 (N,))``.

    ``seen``, when given, counts the category values that were present (``present``) and those the vocabularies
    do not hold (``unseen``), where the encoder keeps the two apart.
    """
    model = model.to(runtime.device).eval()
    for record_batch in batches:
        encoded = encoder.encode_batch(record_batch)
        if seen is not None and encoder.missing_row:
            seen["present"] = seen.get("present", 0) + int((encoded.sparse != MISSING_ROW).sum())
            seen["unseen"] = seen.get("unseen", 0) + int((encoded.sparse == OUT_OF_VOCABULARY_ROW).sum())
        dense, sparse = torch.from_numpy(encoded.dense), torch.from_numpy(encoded.sparse.astype(np.int64))
        scores = [
            logits(
                model,
                dense[begin : begin + MODEL_BATCH_ROWS],
                sparse[begin : begin + MODEL_BATCH_ROWS],
                runtime,
            )
            for begin in range(0, len(dense), MODEL_BATCH_ROWS)
        ]
        yield record_batch, (torch.cat(scores) if scores else torch.zeros(0)).numpy()


def score_days(
    model: torch.nn.Module,
    encoder: FeatureEncoder,
    paths: Sequence[Day],
    runtime: Runtime = CPU,
    progress: bool | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Score labelled Parquet days (or parts of days), keeping only labels and logits (5 bytes per row).

    Returns:
        ``(labels int8 (N,), logits float32 (N,))`` in file order.
    """
    labels, predictions = [], []
    with progress_bar(count_rows(paths), "scoring", "rows", progress) as bar:
        batches = iter_batches(paths, batch_rows=SCORING_BATCH_ROWS)
        for batch, scores in score_batches(model, encoder, batches, runtime):
            predictions.append(scores)
            labels.append(np.asarray(batch.column(LABEL_COLUMN)).astype(np.int8))
            bar.update(len(scores))
    return np.concatenate(labels), np.concatenate(predictions)


PREDICTIONS_SCHEMA = pa.schema(
    [
        pa.field("day", pa.string(), nullable=False),
        # The row's line in its raw file (1-based), or its position in a Parquet day given as input (0-based).
        pa.field("row", pa.int64(), nullable=False),
        pa.field(PREDICTION_COLUMN, pa.float32(), nullable=False),  # calibrated (the checkpoint's calibration)
        pa.field(LOGIT_COLUMN, pa.float32(), nullable=False),  # the model's raw output, before calibration
        pa.field("label", pa.int8()),  # null where the input had no label
    ]
)


def write_predictions(
    model: torch.nn.Module,
    calibration: Calibrator,
    encoder: FeatureEncoder,
    days: Sequence[tuple[str, str | Path]],
    destination: str | Path,
    runtime: Runtime = CPU,
    progress: bool | None = None,
) -> tuple[np.ndarray, np.ndarray | None, float | None]:
    """Score Parquet days (labelled or not) into one Parquet file of ``PREDICTIONS_SCHEMA``, streaming.

    Memory holds one batch, plus 5 bytes per row for the metrics when every day is labelled.

    Returns:
        ``(calibrated probabilities float32 (N,), labels int8 (N,) or None when a day had no label, the share of present
        category values the checkpoint's vocabularies do not hold, or None for an encoder of the earlier layout)``.
    """
    try:
        return _write_predictions(model, calibration, encoder, days, destination, runtime, progress)
    except OSError as error:
        if is_disk_full(error):
            Path(destination).unlink(missing_ok=True)
            raise disk_full_error(Path(destination).parent, f"the predictions ({destination})") from error
        raise


def _write_predictions(model, calibration, encoder, days, destination, runtime, progress):
    scores, labels, labelled, seen = [], [], True, {}
    with (
        create_exclusive(destination) as handle,
        pq.ParquetWriter(handle, PREDICTIONS_SCHEMA) as writer,
        progress_bar(count_rows([path for _, path in days]), "scoring", "rows", progress) as bar,
    ):
        for day, path in days:
            names = open_day(path, labelled=False).schema_arrow.names
            columns = [*FEATURE_COLUMNS, *(name for name in (LABEL_COLUMN, LINE_COLUMN) if name in names)]
            position = 0
            batches = iter_batches([path], columns, SCORING_BATCH_ROWS)
            for batch, batch_logits in score_batches(model, encoder, batches, runtime, seen):
                batch_scores = calibrated(calibration, batch_logits)
                rows = len(batch_scores)
                if LINE_COLUMN in names:
                    row_ids = batch.column(LINE_COLUMN)
                else:
                    row_ids = pa.array(np.arange(position, position + rows))
                label = (
                    batch.column(LABEL_COLUMN).cast(pa.int8()) if LABEL_COLUMN in names else pa.nulls(rows, pa.int8())
                )
                writer.write_batch(
                    pa.RecordBatch.from_arrays(
                        [
                            pa.array([day] * rows, pa.string()),
                            row_ids,
                            pa.array(batch_scores),
                            pa.array(batch_logits),
                            label,
                        ],  # fmt: skip
                        schema=PREDICTIONS_SCHEMA,
                    )
                )
                scores.append(batch_scores)
                labelled = labelled and LABEL_COLUMN in names
                if labelled:
                    labels.append(label.to_numpy(zero_copy_only=False))
                position += rows
                bar.update(rows)
    all_scores = np.concatenate(scores) if scores else np.zeros(0, np.float32)
    unseen = seen["unseen"] / max(seen["present"], 1) if seen else None
    return all_scores, (np.concatenate(labels) if labelled and labels else None), unseen


@torch.no_grad()
def predict(
    model: torch.nn.Module,
    loader: BatchLoader,
    runtime: Runtime = CPU,
    progress: bool | None = False,
    output: str = "probability",
    on_device: bool = False,
) -> np.ndarray | torch.Tensor:
    """The model's own click probabilities (``output="logit"``: its logits) for every encoded row of ``loader``,
    in order: (N,) float32 probabilities as the model computed them (training's validation: the AUC sorts them
    as float32), float64 logits (the rows calibration is fitted on). ``on_device``: a tensor on the runtime's device
    instead (no copy to the host per batch; the validation's metrics are computed where it is)."""
    model.eval()
    score = probabilities if output == "probability" else logits
    outputs = []
    with progress_bar(len(loader.arrays), "scoring", "rows", progress) as bar:
        for batch in loader.batches():
            outputs.append(score(model, batch.dense, batch.sparse, runtime, on_device))
            bar.update(len(batch))
    if not outputs:
        return np.zeros(0, np.float32 if output == "probability" else np.float64)
    scores = torch.cat(outputs)
    scores = scores.float() if output == "probability" else scores.double()
    return scores if on_device else scores.numpy()
