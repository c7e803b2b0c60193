"""What the integrity checks cost: each check next to the work it guards, on the same 1,000,000 rows, in one run.

- a Parquet day: written with page checksums against without; read verified (what metadata, encoding and
  evaluation do) against unverified; the full verification ingestion does before it reuses a day;
- encoded rows: the digests written after encoding and checked on load, against the encoding itself;
- a checkpoint of the default model: its sha256 checked on load, against the load.

    python -m benchmarks.integrity [--rows 1000000] [--repeats 3]
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import torch

from benchmarks.harness import Arguments, Table, best_of, cpu_model
from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.chunk_digests import verify_encoded, write_digests
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.data.parquet import BATCH_ROWS, verify_day
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.stored import open_encoded
from criteo_dlrm.data.synthetic import ClickModel, write_day
from criteo_dlrm.datasets import TorchCheckpointDataset
from criteo_dlrm.engine.trained.checkpoint import Checkpoint, TrainedWith
from criteo_dlrm.models import DLRM

# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--rows", "10000", "--repeats", "1"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows, repeats = args.rows, args.repeats
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_day(folder / "day_0", rows, day=0, model=ClickModel(seed=0))
        parquet = Path(convert_day(folder / "day_0", folder / "day_0.parquet", progress=False).parquet)
        table = pq.read_table(parquet)
        measured = {}
        measured["write a day, page checksums"] = best_of(
            repeats, lambda: pq.write_table(table, folder / "with.parquet", write_page_checksum=True)
        )
        measured["write a day, no checksums (baseline)"] = best_of(
            repeats, lambda: pq.write_table(table, folder / "without.parquet")
        )

        def read(verify: bool) -> None:
            day = pq.ParquetFile(parquet, page_checksum_verification=verify)
            for _ in day.iter_batches(batch_size=BATCH_ROWS):
                pass

        measured["read a day, checksums verified"] = best_of(repeats, lambda: read(True))
        measured["read a day, unverified (baseline)"] = best_of(repeats, lambda: read(False))
        measured["verify a day before reusing it (ingestion)"] = best_of(repeats, lambda: verify_day(parquet))
        measured["convert the day (what a reuse saves)"] = best_of(
            1, lambda: convert_day(folder / "day_0", folder / "again.parquet", progress=False)
        )

        metadata, vocabularies = compute_feature_metadata([parquet], MetadataConfig(), progress=False)
        encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
        encoded = folder / "encoded"
        measured["encode the day into stored rows (baseline)"] = best_of(
            1, lambda: encoder.encode_days([parquet], into=encoded, workers=1)
        )
        measured["digest the stored rows after encoding"] = best_of(repeats, lambda: write_digests(encoded))
        measured["open the stored rows (small files and sizes checked)"] = best_of(
            repeats, lambda: open_encoded(encoded)
        )
        measured["check every chunk of the stored rows (as training first reads them)"] = best_of(
            repeats, lambda: verify_encoded(encoded)
        )
        size = sum(path.stat().st_size for path in encoded.iterdir())

        sizes = metadata.table_sizes
        model = DLRM(TrainingConfig().model_config(sizes))  # the project's default model (parameters_training.yml)
        dataset = TorchCheckpointDataset(str(folder / "checkpoint.pt"))
        dataset.save(
            Checkpoint(
                step=0,
                model_config=model.config,
                trained_with=TrainedWith(),
                encoder_state={},
                model_state=model.state_dict(),
            )  # fmt: skip
        )
        checkpoint = folder / "checkpoint.pt"
        measured["load a checkpoint, digest checked"] = best_of(repeats, dataset.load)
        measured["load a checkpoint, torch.load alone (baseline)"] = best_of(
            repeats, lambda: torch.load(checkpoint, map_location="cpu", weights_only=True)
        )
        checkpoint_size = checkpoint.stat().st_size

    print(f"{cpu_model()}, {rows:,} rows, {time.strftime('%Y-%m-%d')}, best of {repeats}\n")
    table = Table("operation", "seconds", "x its baseline")
    baselines = {
        "write a day, page checksums": "write a day, no checksums (baseline)",
        "read a day, checksums verified": "read a day, unverified (baseline)",
        "verify a day before reusing it (ingestion)": "convert the day (what a reuse saves)",
        "digest the stored rows after encoding": "encode the day into stored rows (baseline)",
        "open the stored rows (small files and sizes checked)": "encode the day into stored rows (baseline)",
        "check every chunk of the stored rows (as training first reads them)": (
            "encode the day into stored rows (baseline)"
        ),
        "load a checkpoint, digest checked": "load a checkpoint, torch.load alone (baseline)",
    }
    for name, seconds in measured.items():
        ratio = f"{seconds / measured[baselines[name]]:.2f}" if name in baselines else ""
        table.row(name, f"{seconds:.3f}", ratio)
    print(f"\nstored rows: {size / 1e6:,.0f} MB; checkpoint: {checkpoint_size / 1e6:,.1f} MB")


if __name__ == "__main__":
    main()
