"""Scoring nodes: thin adapters over ``criteo_dlrm.data.raw`` and ``criteo_dlrm.engine`` (scoring, export)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from loguru import logger

from criteo_dlrm.common.schema import RawLayout
from criteo_dlrm.common.storage import remove_stale_partials, staging_path
from criteo_dlrm.config import ScoringConfig
from criteo_dlrm.data.lineage import day_lineage
from criteo_dlrm.data.raw import convert_days, day_name, find_scoring_input, is_labelled, parquet_folder
from criteo_dlrm.data.source_days import SourceDay
from criteo_dlrm.engine.trained.reports import ExportReport, ScoringReport

# The engine (torch) is imported by the node that scores or exports: every ``kedro`` command that builds the
# pipelines (``kedro catalog``, ``kedro viz``, an ingestion run) imports this module.
if TYPE_CHECKING:
    from criteo_dlrm.engine.trained.checkpoint import Checkpoint
else:  # the name the annotations read at run time (Kedro reads every node's type hints)
    Checkpoint = Any


def input_days(config: ScoringConfig) -> list[SourceDay]:
    """The days of ``scoring.input_dir`` as Parquet with lineage: raw day files (labelled or not) are
    converted with ingestion's rules, keeping line numbers, into their own folder under
    ``scoring.parquet_dir``; a folder of ``*.parquet`` days is used as it is."""
    sources, parquet = find_scoring_input(config.input_dir)
    if parquet:
        return [day_lineage(path.stem, path) for path in parquet]
    output = parquet_folder(config.parquet_dir, Path(config.input_dir))
    reports = convert_days(
        [(source, output / f"{day_name(source)}.parquet") for source in sources],
        layouts=[RawLayout(labelled=is_labelled(source), line_numbers=True) for source in sources],
        max_reject_fraction=config.max_reject_fraction,
        block_size=config.block_size,
        parameters="scoring",
    )
    days = [day_lineage(day_name(source), report.parquet) for source, report in zip(sources, reports, strict=True)]
    return days


# A share of category values unseen in training above this is worth a warning: later days of the same logs
# keep most values known, days of other data (another hash, another product) leave most of them unseen.
UNSEEN_WARNING = 0.5


def score_new_days(dlrm_checkpoint: Checkpoint, scoring: dict) -> tuple[Path, ScoringReport]:
    """Click probabilities for every row of ``scoring.input_dir``, with the checkpoint's own encoder.

    Returns:
        ``(predictions, scoring_report)``: a Parquet file (day, row: line in the raw file or position in
        a Parquet day, click_probability, label or null) that the catalog moves into its versioned place,
        and a report (rows, mean prediction, metrics when every row is labelled, checkpoint, lineage).
    """
    from criteo_dlrm.engine.device import Runtime, resolve_device
    from criteo_dlrm.engine.trained.metrics import binary_metrics
    from criteo_dlrm.engine.trained.scoring import write_predictions

    config = ScoringConfig.from_dict(scoring, "scoring.")
    checkpoint = dlrm_checkpoint
    source, encoder = checkpoint.source, checkpoint.encoder()
    days = input_days(config)
    # Staged beside the scoring input (the catalog copies it into its versioned place and deletes it); what a
    # killed run left there is removed by the next one.
    remove_stale_partials(config.parquet_dir)
    staged = staging_path(Path(config.parquet_dir) / "predictions.parquet")
    if not checkpoint.calibrated:
        logger.warning("{} was made before calibration: its probabilities are the model's raw output", source)
    scores, labels, unseen = write_predictions(
        checkpoint.model(),
        checkpoint.calibration(),
        encoder,
        [(day.day, day.parquet) for day in days],
        staged,
        Runtime(resolve_device(config.device, "scoring.device"), config.precision),
    )
    report = ScoringReport(
        checkpoint_version=checkpoint.version,
        metadata_version=checkpoint.metadata_version,
        input_dir=str(config.input_dir),
        rows=int(len(scores)),
        calibration_method=checkpoint.calibration_method,
        mean_prediction=float(np.mean(scores, dtype=np.float64)) if len(scores) else None,
        labelled=labels is not None,
        unseen_share=unseen,
        metrics=binary_metrics(labels, scores) if labels is not None and len(scores) else None,
        source_days=days,
    )
    if unseen is not None and unseen > UNSEEN_WARNING:
        logger.warning(
            "{:.0%} of the category values scored are not in {}'s vocabularies: these days look like other data "
            "than the model was trained on, and its predictions for them rest on the dense features alone.",
            unseen, source,
        )  # fmt: skip
    logger.info(
        "{}: scored {:,} rows of {} (mean prediction {:.4f}){}",
        source, report.rows, [day.day for day in days], report.mean_prediction or 0.0,
        f"; AUC {report.metrics.auc:.4f}, log loss {report.metrics.log_loss:.5f}" if report.metrics else "",
    )  # fmt: skip
    return staged, report


def export_model(dlrm_checkpoint: Checkpoint, scoring: dict) -> tuple[bytes, bytes | None, bytes, ExportReport]:
    """ONNX (checked against PyTorch with onnxruntime), ``torch.export`` and the serving encoder.

    Returns:
        ``(dlrm_onnx, dlrm_exported_program, serving_encoder, export_report)``.
    """
    from criteo_dlrm.engine.trained.export import (
        ENCODER_FORMAT,
        ScoringModel,
        check_onnx,
        export_onnx,
        export_program,
        serving_encoder,
    )

    config = ScoringConfig.from_dict(scoring, "scoring.")
    checkpoint = dlrm_checkpoint
    # The encoder is checked as scoring and evaluation check it: a served model with other vocabularies would
    # mis-encode every request.
    encoder = checkpoint.encoder()
    dlrm = checkpoint.model()
    model = ScoringModel(dlrm, checkpoint.calibration())
    sizes = dlrm.config.table_sizes
    onnx_model = export_onnx(model, sizes)
    check = check_onnx(onnx_model, model, sizes, config.export.check_rows, config.export.tolerance)
    program = export_program(model, sizes)
    report = ExportReport(
        checkpoint_version=checkpoint.version,
        metadata_version=checkpoint.metadata_version,
        inputs={"dense": "(batch, 13) float32", "sparse": "(batch, 26) int64"},
        output={
            "probability": "(batch,) float32, calibrated",
            "logit": "(batch,) float32, the model's output before calibration",
        },
        calibration_method=model.calibration.method,
        onnx_check=check,
        onnx_bytes=len(onnx_model),
        exported_program_bytes=len(program),
        encoder_format=ENCODER_FORMAT,
    )
    return onnx_model, program, serving_encoder(encoder), report
