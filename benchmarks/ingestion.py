"""Ingestion benchmark: our streaming converter against the predecessor's pandas + per-cell ``int(x, 16)``.

Generates N rows of Criteo-format data, converts them both ways in separate processes (so each
reports its own peak RSS), and prints rows/s, peak memory and the ratio. Ours is also run on 4N rows
to show that its peak memory does not grow with the file, and its phases are timed alone on that file, each
against pyarrow's own CSV reader of the same file (the reading limit). ``--gzip``: the days as ``.gz``, as
Criteo's are. ``--sample FILE``: the days repeat that file's rows (real Criteo rows, e.g. the head of a day)
instead of generated ones.

    python -m benchmarks.ingestion --rows 1000000 --gzip
    python -m benchmarks.ingestion --rows 1000000 --gzip --sample day_0_head.tsv
"""

from __future__ import annotations

import gzip
import json
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from benchmarks.harness import Arguments, Table, child_command, describe_machine
from criteo_dlrm.common.schema import DENSE_COLUMNS, SPARSE_COLUMNS
from criteo_dlrm.data.parquet import WRITE_OPTIONS
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.raw.convert import ROW_GROUP_ROWS, TRAINING_LAYOUT, ConversionOptions
from criteo_dlrm.data.raw.files import open_raw
from criteo_dlrm.data.raw.parsing import parse_batch
from criteo_dlrm.data.raw.reader import LineTracker, csv_reader
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


def write_sampled_day(path: Path, rows: int, sample: Path) -> None:
    """A day of ``rows`` lines that repeat ``sample``'s lines in order (gzip'd when ``path`` ends in ``.gz``): real
    rows' empty cells, counts and categories, which generated rows only imitate."""
    lines = sample.read_bytes().splitlines(keepends=True)
    if not lines:
        raise SystemExit(f"{sample}: no rows to repeat; --sample takes a Criteo TSV file")
    lines[-1] = lines[-1].rstrip(b"\r\n") + b"\n"
    whole, rest = divmod(rows, len(lines))
    block = b"".join(lines)
    with (gzip.open if path.name.endswith(".gz") else open)(path, "wb") as handle:
        for _ in range(whole):
            handle.write(block)
        handle.writelines(lines[:rest])


def worker(method: str, source: Path, destination: Path) -> None:
    started, cpu = time.perf_counter(), time.process_time()
    if method == "ours":
        rows = convert_day(source, destination, progress=False).rows
    else:
        rows = predecessor_convert(source, destination)
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"rows": rows, "seconds": seconds, "cpu_seconds": cpu, "peak_mb": peak_mb}))


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


# The converter's block of text (its default, as ingestion.block_size_mb's).
BLOCK = ConversionOptions().block_size


def phases(source: Path, folder: Path, whole: dict) -> None:
    """Each phase of converting ``source`` timed alone, wall and CPU seconds, then ``whole``, the conversion as
    ``measure`` ran it (the converter overlaps reading, parsing and writing in three threads: its wall time is at
    least the CPU total over the cores)."""
    table = Table("phase", "wall s", "CPU s", align="lrr")

    def timed(name: str, work):
        wall, cpu = time.perf_counter(), time.process_time()
        result = work()
        table.row(name, f"{time.perf_counter() - wall:.2f}", f"{time.process_time() - cpu:.2f}")
        return result

    def decompress() -> None:
        with open_raw(source)[1] as stream:
            while stream.read(BLOCK):
                pass

    def split() -> list[pa.RecordBatch]:
        with open_raw(source)[1] as stream:
            return list(csv_reader(stream, BLOCK, LineTracker(), TRAINING_LAYOUT.raw_columns))

    def arrow_typed() -> None:
        with open_raw(source)[1] as stream:
            options = pa_csv.ReadOptions(column_names=TRAINING_LAYOUT.raw_columns, block_size=BLOCK, use_threads=False)
            pa_csv.read_csv(stream, read_options=options, parse_options=pa_csv.ParseOptions(delimiter="\t"))

    def write(typed: pa.Table) -> Path:
        path = folder / "phases.parquet"
        pq.write_table(typed, path, row_group_size=ROW_GROUP_ROWS, **WRITE_OPTIONS)
        return path

    def fsync(path: Path) -> None:
        handle = os.open(path, os.O_RDONLY)
        try:
            os.fsync(handle)
        finally:
            os.close(handle)

    timed("read: decompress only" if source.name.endswith(".gz") else "read only", decompress)
    batches = timed("read and split into 40 byte columns (ours)", split)
    timed("limit: pyarrow's read_csv typing the file itself, one thread", arrow_typed)
    typed = timed("parse: validate and type (parse_batch)", lambda: pa.Table.from_batches(
        [parse_batch(batch)[0] for batch in batches]))  # fmt: skip
    batches.clear()  # the blocks of text given back before the write
    written = timed("write: Parquet with page checksums", lambda: write(typed))
    timed("fsync", lambda: fsync(written))
    table.row("the whole conversion (convert_day: its threads overlap)", f"{whole['seconds']:.2f}",
              f"{whole['cpu_seconds']:.2f}")  # fmt: skip


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--rows", "10000", "--gzip"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--worker", choices=["ours", "predecessor"])
    parser.add_argument("--source", type=Path)
    parser.add_argument("--destination", type=Path)
    parser.add_argument("--gzip", action="store_true", help="the generated days as .gz files")
    parser.add_argument("--sample", type=Path, help="a Criteo TSV file whose rows the days repeat")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.source, args.destination)
        return

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = ClickModel(seed=0)
        suffix = ".gz" if args.gzip else ""
        large, huge = folder / f"day_0{suffix}", folder / f"day_1{suffix}"

        def write_source(path: Path, rows: int, day: int) -> None:
            if args.sample:
                write_sampled_day(path, rows, args.sample)
            else:
                write_day(path, rows, day=day, model=model)

        write_source(large, args.rows, day=0)
        results = {
            f"ours, {args.rows:,} rows": measure("ours", large, folder),
            f"predecessor, {args.rows:,} rows": measure("predecessor", large, folder),
        }
        size_mb = large.stat().st_size / 1e6
        large.unlink()
        write_source(huge, 4 * args.rows, day=1)
        results[f"ours, {4 * args.rows:,} rows"] = measure("ours", huge, folder)
        describe_machine()
        kind = "gzip'd" if args.gzip else "plain"
        origin = f"{args.sample.name}'s rows repeated" if args.sample else "generated rows"
        print(f"\nIngestion of {args.rows:,} rows of {kind} Criteo TSV, {origin} ({size_mb:,.0f} MB)\n")
        table = Table("method", "rows/s", "seconds", "peak RSS (MB)")
        for name, result in results.items():
            table.row(
                name,
                f"{result['rows'] / result['seconds']:,.0f}",
                f"{result['seconds']:.1f}",
                f"{result['peak_mb']:,.0f}",
            )
        ours, predecessor = results[f"ours, {args.rows:,} rows"], results[f"predecessor, {args.rows:,} rows"]
        ratio = (ours["rows"] / ours["seconds"]) / (predecessor["rows"] / predecessor["seconds"])
        print(f"\nspeed-up over the predecessor: {ratio:.1f}x")
        print(f"\nPhases of ours on the {4 * args.rows:,}-row file, each alone:\n")
        phases(huge, folder, results[f"ours, {4 * args.rows:,} rows"])


if __name__ == "__main__":
    main()
