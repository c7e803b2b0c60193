"""Batch-scoring benchmark: the scoring pipeline's streaming writer against the evaluation pipeline's
scoring loop and the training loader, on the same Parquet day and model, in one run.

    python -m benchmarks.scoring [--rows 1000000]

Rows/s of (1) the training batch loader over already-encoded arrays (what training reads), (2) reading and
encoding the Parquet day without a model, (3) the evaluation loop as it was (one forward pass per
262,144-row Parquet batch), (4) the evaluation loop now (``score_days``: slices of ``MODEL_BATCH_ROWS``),
(5) batch scoring (``write_predictions``: encode + model + Parquet output, streaming), (6) onnxruntime on
the exported model over the encoded rows.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnxruntime
import torch

from benchmarks.harness import Arguments, Table, timed
from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.batches import BatchLoader
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.data.parquet import iter_batches
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.synthetic import ClickModel, write_day
from criteo_dlrm.engine.trained import scoring
from criteo_dlrm.engine.trained.calibration import Identity
from criteo_dlrm.engine.trained.export import export_onnx
from criteo_dlrm.engine.trained.scoring import score_days, write_predictions
from criteo_dlrm.models import DLRM

# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--rows", "10000"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        write_day(work / "day_0", args.rows, day=0, model=ClickModel(seed=0))
        parquet = convert_day(work / "day_0", work / "day_0.parquet", progress=False).parquet
        metadata, vocabularies = compute_feature_metadata(
            [parquet], MetadataConfig(min_expected_clicks=0, min_frequency=3), progress=False
        )
        encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
        torch.manual_seed(0)
        # The project's default model (parameters_training.yml), built as training builds it.
        config = TrainingConfig().model_config(encoder.table_sizes)
        model = DLRM(config).eval()
        encoded = encoder.encode_days([parquet])
        loader = BatchLoader(encoded, 16384)
        session = onnxruntime.InferenceSession(
            export_onnx(model, config.table_sizes), providers=["CPUExecutionProvider"]
        )

        def onnx_scores() -> None:
            for begin in range(0, args.rows, 16384):
                end = min(begin + 16384, args.rows)
                session.run(
                    None, {"dense": encoded.dense[begin:end], "sparse": encoded.sparse[begin:end].astype(np.int64)}
                )

        def whole_batch_evaluation() -> None:
            """The evaluation loop as it was before this benchmark: one forward per 262,144-row Parquet batch."""
            sliced, scoring.MODEL_BATCH_ROWS = scoring.MODEL_BATCH_ROWS, 1 << 30
            try:
                score_days(model, encoder, [parquet], progress=False)
            finally:
                scoring.MODEL_BATCH_ROWS = sliced

        results = {}
        for _ in range(2):  # best of two: the first run touches fresh memory
            measured = {
                "training batch loader over encoded arrays (batch 16,384)": timed(
                    lambda: [b for b in loader.batches()]
                ),
                "reading + encoding the Parquet day, no model": timed(
                    lambda: [encoder.encode_batch(b) for b in iter_batches([parquet])]
                ),
                "baseline: evaluation loop, one forward per Parquet batch (before)": timed(whole_batch_evaluation),
                "evaluation loop (`score_days`: encode + model, in memory)": timed(
                    lambda: score_days(model, encoder, [parquet], progress=False)
                ),
                "batch scoring (`write_predictions`: encode + model + Parquet out)": timed(
                    lambda: (
                        (work / "p.parquet").unlink(missing_ok=True)
                        or write_predictions(
                            model,
                            Identity(),
                            encoder,
                            [("day_0", parquet)],
                            work / "p.parquet",
                            progress=False,
                        )
                    )
                ),
                "onnxruntime on the exported model (encoded rows, batch 16,384)": timed(onnx_scores),
            }
            results = {name: min(seconds, results.get(name, seconds)) for name, seconds in measured.items()}
    print(f"\n{args.rows:,} rows, default model ({sum(p.numel() for p in model.parameters()):,} parameters), "
          f"{torch.get_num_threads()} threads\n")  # fmt: skip
    table = Table("measurement", "rows/s")
    for name, seconds in results.items():
        table.row(name, f"{args.rows / seconds:,.0f}")
    evaluation = results["evaluation loop (`score_days`: encode + model, in memory)"]
    scoring_seconds = results["batch scoring (`write_predictions`: encode + model + Parquet out)"]
    baseline = results["baseline: evaluation loop, one forward per Parquet batch (before)"]
    print(f"\nbatch scoring / evaluation loop: {evaluation / scoring_seconds:.2f}x the rate")
    print(f"batch scoring / the evaluation loop before (whole-batch forward): {baseline / scoring_seconds:.2f}x")


if __name__ == "__main__":
    main()
