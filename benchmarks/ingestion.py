"""Ingestion benchmark: our streaming converter against the predecessor's pandas + per-cell ``int(x, 16)``.

Generates N rows of Criteo-format data, converts them both ways in separate processes (so each
reports its own peak RSS), and prints rows/s, peak memory and the ratio. Ours is also run on 4N rows
to show that its peak memory does not grow with the file.

    python -m benchmarks.ingestion --rows 1000000
"""

from __future__ import annotations

import json
import resource
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.harness import Arguments, Table, child_command
from criteo_dlrm.common.schema import DENSE_COLUMNS, SPARSE_COLUMNS
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.synthetic import ClickModel, write_day


def predecessor_convert(source: Path, destination: Path) -> int:
    """The predecessor's preprocessing (DESIGN.md section 2), made to run on pandas 3."""
    names = ["labels", *DENSE_COLUMNS, *SPARSE_COLUMNS]
    rows = 0
    writer = None
    for chunk in pd.read_csv(source, sep="\t", header=None, names=names, chunksize=1_000_000, dtype=str):
        frame = pd.DataFrame({"labels": chunk["labels"].astype(np.int64)})
        for name in DENSE_COLUMNS:
            frame[name] = chunk[name].astype(np.float32).fillna(0)
        for name in SPARSE_COLUMNS:
            frame[name] = [int(value, 16) if isinstance(value, str) else -1 for value in chunk[name]]
        table = pa.Table.from_pandas(frame, preserve_index=False)
        writer = writer or pq.ParquetWriter(destination, table.schema)
        writer.write_table(table)
        rows += len(frame)
    writer.close()
    return rows


def worker(method: str, source: Path, destination: Path) -> None:
    started = time.perf_counter()
    if method == "ours":
        rows = convert_day(source, destination, progress=False).rows
    else:
        rows = predecessor_convert(source, destination)
    seconds = time.perf_counter() - started
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"rows": rows, "seconds": seconds, "peak_mb": peak_mb}))


def measure(method: str, source: Path, folder: Path) -> dict:
    output = subprocess.run(
        [
            *child_command(__spec__.name),
            "--worker",
            method,
            "--source",
            str(source),
            "--destination",
            str(folder / f"{method}.parquet"),
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(output.strip().splitlines()[-1])


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--rows", "10000"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--worker", choices=["ours", "predecessor"])
    parser.add_argument("--source", type=Path)
    parser.add_argument("--destination", type=Path)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.source, args.destination)
        return

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = ClickModel(seed=0)
        large, huge = folder / "day_0", folder / "day_1"
        write_day(large, args.rows, day=0, model=model)
        results = {
            f"ours, {args.rows:,} rows": measure("ours", large, folder),
            f"predecessor, {args.rows:,} rows": measure("predecessor", large, folder),
        }
        size_mb = large.stat().st_size / 1e6
        large.unlink()
        write_day(huge, 4 * args.rows, day=1, model=model)
        results[f"ours, {4 * args.rows:,} rows"] = measure("ours", huge, folder)
    print(f"\nIngestion of {args.rows:,} rows of plain Criteo TSV ({size_mb:,.0f} MB)\n")
    table = Table("method", "rows/s", "seconds", "peak RSS (MB)")
    for name, result in results.items():
        table.row(
            name, f"{result['rows'] / result['seconds']:,.0f}", f"{result['seconds']:.1f}", f"{result['peak_mb']:,.0f}"
        )
    ours, predecessor = results[f"ours, {args.rows:,} rows"], results[f"predecessor, {args.rows:,} rows"]
    ratio = (ours["rows"] / ours["seconds"]) / (predecessor["rows"] / predecessor["seconds"])
    print(f"\nspeed-up over the predecessor: {ratio:.1f}x")


if __name__ == "__main__":
    main()
