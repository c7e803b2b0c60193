"""The training loader's rows/s in one process, cold and warm page cache, with 1, 2 and 4 reading threads.

    python -m benchmarks.loader [--rows 10000000] [--batches 300] [--threads 1 2 4]

Random encoded rows (Criteo 1TB's index widths) stored as this project stores them, chunk digests included (the
rows of ``benchmarks.scale``). Each measurement is a fresh process that opens the rows and takes ``--batches``
shuffled batches of 16,384 rows as training takes them (``BatchLoader.batches(read_ahead=True)``: the next
window read in a thread of its own while this one is cut into batches, its chunks by ``reading_threads``
threads); cold: the rows' files dropped from the page cache first (their digests are checked on this first
read, as a run's first epoch does); warm: read once before (digests checked then, not again). The baselines,
measured in the same run: the files read whole, in order, in 8 MB reads by one thread (cold: the disk's
sequential rate; warm: the page cache's copy rate), as rows/s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.harness import Arguments, Table, child_command, cpu_model
from benchmarks.scale import BATCH, drop_from_cache, write_rows

FILES = ("labels.npy", "dense.npy", "sparse.npy")


def read_whole(folder: Path) -> float:
    """Rows/s of reading the rows' files whole, in order, 8 MB at a time, in this thread."""
    from criteo_dlrm.data.stored import open_encoded

    rows = len(open_encoded(folder, verify=False))
    start = time.perf_counter()
    for name in FILES:
        with open(folder / name, "rb", buffering=0) as handle:
            while handle.read(8 << 20):
                pass
    return rows / (time.perf_counter() - start)


def prepare(folder: Path, cache: str) -> None:
    """The rows' files dropped from the page cache (``cold``), or read into it (``warm``)."""
    if cache == "cold":
        drop_from_cache(folder)
    else:
        read_whole(folder)


def measure(folder: Path, cache: str, threads: int, batches: int) -> dict:
    """In this (fresh) process: the loader's first batch and its rows/s over ``batches`` batches; warm, the rows
    are opened and their digests checked before (as an epoch after the first finds them), cold, in the time."""
    from criteo_dlrm.data.batches import BatchLoader
    from criteo_dlrm.data.stored import open_encoded

    prepare(folder, cache)
    arrays = None
    if cache == "warm":
        arrays = open_encoded(folder)
        arrays.check_rows(0, len(arrays))
    start = time.perf_counter()
    if arrays is None:
        arrays = open_encoded(folder)
    loader = BatchLoader(arrays, BATCH, shuffle=True, reading_threads=threads)
    first, rows = None, 0
    for index, batch in enumerate(loader.batches(read_ahead=True)):
        first = first or time.perf_counter() - start
        rows += len(batch)
        if index + 1 == batches:
            break
    return {"first_batch_s": first, "rows_per_s": rows / (time.perf_counter() - start)}


def _fresh(*args: str) -> dict:
    result = subprocess.run([*child_command(__spec__.name), *args], capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--rows", "200000", "--batches", "4", "--threads", "1", "2"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--measure", nargs=4, help="internal: folder, cold or warm, threads, batches")
    parser.add_argument("--whole", nargs=2, help="internal: folder, cold or warm")
    args = parser.parse_args()
    if args.measure:
        folder, cache, threads, batches = args.measure
        print(json.dumps(measure(Path(folder), cache, int(threads), int(batches))))
        return
    if args.whole:
        folder, cache = Path(args.whole[0]), args.whole[1]
        prepare(folder, cache)
        print(json.dumps({"rows_per_s": read_whole(folder)}))
        return
    base = Path(tempfile.mkdtemp(prefix="loader-"))
    try:
        folder = base / "rows"
        write_rows(folder, args.rows)
        size = sum((folder / name).stat().st_size for name in FILES)
        print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; {args.rows:,} rows ({size / 1e6:,.0f} MB), batches of "
              f"{BATCH:,} rows, the first {args.batches} of an epoch; each line a fresh process\n")  # fmt: skip
        table = Table("page cache", "reading threads", "first batch (s)", "rows/s", "x 1 thread",
                      "share of the files' sequential read", align="llrrrr")  # fmt: skip
        for cache in ("cold", "warm"):
            whole = _fresh("--whole", str(folder), cache)["rows_per_s"]
            one = None
            for threads in args.threads:
                got = _fresh("--measure", str(folder), cache, str(threads), str(args.batches))
                one = one or got["rows_per_s"]
                table.row(cache, threads, f"{got['first_batch_s']:.2f}", f"{got['rows_per_s']:,.0f}",
                          f"{got['rows_per_s'] / one:.2f}", f"{got['rows_per_s'] / whole:.0%}")  # fmt: skip
            table.row(cache, "the files read whole, 1 thread", "", f"{whole:,.0f}", "", "100%")
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
