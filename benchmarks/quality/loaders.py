"""Model quality with each way of shuffling (a full permutation, the pipeline's stored shuffle read in chunks,
chunks of day-ordered rows) on the same rows, over seeds.

    python -m benchmarks.quality.loaders --rows 1000000 --seeds 0 1 2
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.harness import Table
from benchmarks.quality.common import (
    CURVE_SETTINGS,
    DAY_ROWS,
    encode,
    fit_dlrm,
    in_a_work_folder,
    study_arguments,
    world_days,
)
from criteo_dlrm.data.encoding import FeatureEncoder

# The worlds of the loader study: the planted model at 25% and 3% clicks, and one whose click rate drifts from
# day to day (5% on day 0, +3 points a day), the days stored in order, as ingestion writes them.
LOADER_WORLDS = {
    "25% clicks": lambda day: 0.25,
    "3% clicks": lambda day: 0.03,
    "drifting": lambda day: 0.05 + 0.03 * day,
}


def loader_study(size: int, validation_rows: int, work: Path, seeds: list[int], chunk_rows: int) -> None:
    """Model quality with each way of shuffling, on the same rows, over seeds, one epoch each (the best epoch at
    1M rows): a full permutation of day-ordered rows (the loader before chunks: ``PermutationLoader``); the
    pipeline's way (rows stored shuffled by encoding, read in chunks); and chunks of day-ordered rows (what
    ``BatchLoader`` does by itself with rows stored in day order; drifting world only).

    ``chunk_rows`` scales the loader's chunk to the study: at Criteo 1TB a window (16 chunks of 65,536 rows) is
    0.02% of the rows; at 1M rows, chunks of 1,024 rows make it 1.6% (a window of all the rows would shuffle fully).
    """
    import criteo_dlrm.data.batches as batches
    import criteo_dlrm.engine.training.process as process
    from benchmarks.baselines import PermutationLoader
    from criteo_dlrm.data.batches import BatchLoader
    from criteo_dlrm.data.chunk_digests import write_digests
    from criteo_dlrm.data.stored import open_encoded

    days = size // DAY_ROWS
    results = []
    for world, ctr_of in LOADER_WORLDS.items():
        paths = world_days(work, world, days, validation_rows, ctr_of)
        options = {**CURVE_SETTINGS, "training.num_epochs": 1}
        metadata, vocabularies, in_order, validation = encode(paths[:-1], paths[-1:], options)
        stored = paths[0].parent / "train_shuffled"
        FeatureEncoder.from_metadata(metadata, vocabularies).encode_days(paths[:-1], into=stored, shuffle=True)
        write_digests(stored)
        ways = {
            "full permutation (before)": (PermutationLoader, in_order),
            "stored shuffled, chunks (pipeline)": (BatchLoader, open_encoded(stored)),
        }
        if world == "drifting":
            ways["day order, chunks"] = (BatchLoader, in_order)
        for way, (loader, train) in ways.items():
            for seed in seeds:
                process.BatchLoader, default_chunk = loader, batches.CHUNK_ROWS
                batches.CHUNK_ROWS = chunk_rows
                try:
                    got = fit_dlrm(
                        (metadata, vocabularies, train, validation), {**options, "training.seed": seed}, work / "tb"
                    )
                finally:
                    process.BatchLoader, batches.CHUNK_ROWS = BatchLoader, default_chunk
                results.append({"world": world, "way": way, "seed": seed, **got})
                print(f"{world}, {way}, seed {seed}: AUC {got['auc']:.4f}, log loss {got['log_loss']:.4f}", flush=True)
    print(
        f"\n{size:,} training rows ({days} days), one epoch, seeds {seeds}, chunks of {chunk_rows:,} rows, "
        f"windows of {batches.WINDOW_CHUNKS}; mean +- standard deviation over seeds:\n"
    )
    table = Table("world", "shuffle", "AUC", "log loss", "AUC - full permutation's", align="llrrr")
    for world in LOADER_WORLDS:
        base = np.mean([r["auc"] for r in results if r["world"] == world and r["way"].startswith("full")])
        for way in dict.fromkeys(r["way"] for r in results if r["world"] == world):
            mine = [r for r in results if r["world"] == world and r["way"] == way]
            auc, loss = np.array([r["auc"] for r in mine]), np.array([r["log_loss"] for r in mine])
            table.row(world, way, f"{auc.mean():.4f} +- {auc.std(ddof=1) if len(auc) > 1 else 0:.4f}",
                      f"{loss.mean():.4f} +- {loss.std(ddof=1) if len(loss) > 1 else 0:.4f}", f"{auc.mean() - base:+.4f}")  # fmt: skip


def main() -> None:
    parser = study_arguments(__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="training rows, a multiple of 100,000")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--chunk-rows", type=int, default=1024, help="the loader's chunk")
    args = parser.parse_args()
    in_a_work_folder(
        args, lambda work: loader_study(args.rows, args.validation_rows, work, args.seeds, args.chunk_rows)
    )


if __name__ == "__main__":
    main()
