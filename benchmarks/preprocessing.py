"""Preprocessing benchmark: ingestion, metadata and encoding with 1 and more worker processes, in one run.

    python -m benchmarks.preprocessing [--days 4] [--rows-per-day 500000] [--workers 1 2] [--distinct 20000000]
                                       [--repeats 3]

Generates D gzip days, then runs each stage with each number of ``--workers`` (1, the baseline, always
included), each measurement in a fresh process (``--repeats`` interleaved runs, the fastest kept), and
prints rows/s, CPU utilisation (the machine's busy share of all cores during the stage, from /proc/stat:
run it on a quiet machine) and peak RSS of the largest process and of the whole process tree (sampled
every 50 ms), with the speed-up over 1 worker, and this machine's ceiling for the largest count's speed-up
(that many single-threaded processes against one, for pure computation, an in-cache vectorised sort and
memory streaming). Then it counts one feature with ``--distinct`` distinct values (as Criteo 1TB's largest
features have tens of millions) to measure the metadata pass's memory per distinct value. Ingestion and
encoding give each worker whole days: use at least as many ``--days`` as workers (on 16 cores:
``--days 16 --workers 1 2 4 8 16``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from benchmarks.harness import Arguments, Table, child_command

STAGES = ("ingestion", "metadata", "encoding")


def _cpu_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


class _Monitor(threading.Thread):
    """Samples the RSS of this process and every descendant (the forkserver's workers included)."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.largest = self.total = 0
        self._done = threading.Event()

    def run(self) -> None:
        me = psutil.Process()
        while not self._done.wait(0.05):
            sizes = []
            for process in [me, *me.children(recursive=True)]:
                try:
                    sizes.append(process.memory_info().rss)
                except psutil.Error:
                    continue
            self.largest, self.total = max(self.largest, max(sizes)), max(self.total, sum(sizes))

    def stop(self) -> None:
        self._done.set()
        self.join()


def measure(stage: str, workers: int | None, data: Path) -> dict:
    """Run one stage in this (fresh) process; the parallel helpers' workers are its children. ``workers`` None:
    the project's default rule (the count it chose is returned as ``workers``)."""
    from criteo_dlrm.common import parallel
    from criteo_dlrm.data import encoding as encoding_module
    from criteo_dlrm.data import metadata as metadata_module
    from criteo_dlrm.data import shuffle as shuffle_module
    from criteo_dlrm.data.raw import days as days_module

    chosen = []

    def recording(*args, **kwargs):
        chosen.append(parallel.choose_workers(*args, **kwargs))
        return chosen[-1]

    for module in (days_module, metadata_module, encoding_module, shuffle_module):
        module.choose_workers = recording
    from criteo_dlrm.config.metadata import MetadataConfig
    from criteo_dlrm.data.encoding import FeatureEncoder
    from criteo_dlrm.data.metadata import compute_feature_metadata
    from criteo_dlrm.data.parquet import count_rows
    from criteo_dlrm.data.raw import convert_days

    raw = sorted(data.glob("raw/day_*.gz"))
    parquet = [data / "parquet" / f"{path.name.removesuffix('.gz')}.parquet" for path in raw]
    settings = MetadataConfig(min_expected_clicks=0, min_frequency=3, workers=workers)
    if stage == "metadata" or stage == "encoding":
        rows = count_rows(parquet)
    if stage == "encoding":
        metadata, vocabularies = compute_feature_metadata(
            parquet, MetadataConfig(min_expected_clicks=0, min_frequency=3, workers=1), False
        )
        encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    # A repeat starts from nothing: ingestion would skip days whose Parquet is already up to date.
    label = workers or "default"
    for previous in (data / f"parquet_{label}", data / f"encoded_{label}"):
        shutil.rmtree(previous, ignore_errors=True)
    if stage == "ingestion":
        output = data / f"parquet_{label}"
        pairs = [(s, output / p.name) for s, p in zip(raw, parquet, strict=True)]
        reports, figures = measured(lambda: convert_days(pairs, workers=workers))
        rows = sum(report.rows for report in reports)
    elif stage == "metadata":
        _, figures = measured(lambda: compute_feature_metadata(parquet, settings, progress=False))
    else:
        _, figures = measured(lambda: encoder.encode_days(parquet, into=data / f"encoded_{label}", workers=workers))
    return {"workers": chosen[-1], "rows": rows, **figures}


def measured(work: Callable[[], Any]) -> tuple[Any, dict]:
    """``work()``'s result, and its wall time, the machine's CPU busy share (all cores) and the peak RSS of this
    process tree (its largest process and all together)."""
    monitor = _Monitor()
    monitor.start()
    busy, total = _cpu_jiffies()
    start = time.perf_counter()
    result = work()
    wall = time.perf_counter() - start
    busy_after, total_after = _cpu_jiffies()
    monitor.stop()
    figures = {
        "wall": wall,
        "busy": (busy_after - busy) / max(total_after - total, 1),
        "largest_rss": monitor.largest,
        "total_rss": monitor.total,
    }
    return result, figures


def count_distinct(distinct: int) -> dict:
    """Peak RSS of counting one feature with ``distinct`` distinct values, streamed in 262,144-row batches."""
    from criteo_dlrm.data.metadata import ValueCounter

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    counter = ValueCounter()
    for begin in range(0, distinct, 1 << 18):
        # An odd multiplier is a bijection modulo 2^64: every value once, scattered, made batch by batch.
        batch = np.arange(begin, min(begin + (1 << 18), distinct), dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        counter.add(batch.view(np.int64))
    result = counter.result()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert len(result[0]) == distinct
    return {"distinct": distinct, "peak_rss": peak, "baseline_rss": before}


def loader_rates(data: Path) -> dict:
    """Training batch loader rows/s over the stored (packed) rows and over the same rows as int32 (the layout
    before), memory-mapped, batch 16,384, shuffled; the two alternate three times, best of each kept."""
    from criteo_dlrm.data.batches import BatchLoader
    from criteo_dlrm.data.stored import bytes_per_row, open_encoded

    packed = open_encoded(data / "encoded_1", verify=False)  # written here, without digests
    plain = data / "encoded_int32"
    plain.mkdir(exist_ok=True)
    for name in ("labels", "dense", "sparse"):
        np.save(
            plain / f"{name}.npy", np.asarray(getattr(packed, name), dtype=np.float32 if name == "labels" else None)
        )
    before = open_encoded(plain, verify=False)
    rates: dict[str, float] = {}
    for _ in range(3):
        for name, arrays in (("packed", packed), ("int32", before)):
            start = time.perf_counter()
            rows = sum(len(batch) for batch in BatchLoader(arrays, 16_384, shuffle=True).batches())
            rates[name] = max(rates.get(name, 0.0), rows / (time.perf_counter() - start))
    return {"rates": rates, "bytes": {"packed": bytes_per_row(packed), "int32": bytes_per_row(before)}}


# Criteo 1TB: 24 days, 4,373,472,329 rows. Table sizes as MLPerf's DLRM reference builds them (vocabularies
# capped at 40M rows); the raw distinct counts of the largest features are higher, so the memory below is a floor.
CRITEO_1TB_ROWS = 4_373_472_329
CRITEO_1TB_TABLES = [39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208,
                     11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36]  # fmt: skip


def project(results: dict, per_value: float, cores: int, workers: int, target_cores: int = 16) -> None:
    """Print Criteo 1TB on ``target_cores`` cores from this run's measured rate per busy core (with ``workers``
    workers, the most measured, so the interference between workers is in it) and memory per distinct value."""
    from criteo_dlrm.data.metadata import feature_groups
    from criteo_dlrm.data.stored import index_widths

    table = Table("stage", f"rows/s per busy core ({workers} workers, measured)",
                  f"{target_cores} cores (projected rows/s)", "Criteo 1TB (hours)")  # fmt: skip
    hours = {}
    for stage in STAGES:
        result = results[(stage, workers)]
        per_core = result["rows"] / result["wall"] / max(result["busy"] * cores, 1e-9)
        hours[stage] = CRITEO_1TB_ROWS / (per_core * target_cores) / 3600
        table.row(stage, f"{per_core:,.0f}", f"{per_core * target_cores:,.0f}", f"{hours[stage]:.2f}")
    table.row("all three", "", "", f"{sum(hours.values()):.2f}")
    slowest = max(hours, key=hours.get)
    widths = index_widths(CRITEO_1TB_TABLES)
    stored = 1 + 4 * 13 + sum(widths)
    groups = feature_groups(4, target_cores)
    passes = sorted((sum(CRITEO_1TB_TABLES[int(name.split("_")[1])] for name in group) for group, _ in groups))
    at_once = sum(passes[-target_cores:])  # the largest passes running together, one per worker
    lines = [
        "",
        f"{slowest} bounds the total. Disk: model input {stored} bytes a row "
        f"({CRITEO_1TB_ROWS * stored / 1e9:,.0f} GB; {CRITEO_1TB_ROWS * 160 / 1e9:,.0f} GB at 160 bytes).",
        f"Metadata memory at {per_value:.0f} bytes per distinct value: all 26 features "
        f"{sum(CRITEO_1TB_TABLES) * per_value / 1e9:.1f} GB in one pass; with features_per_pass=4 on {target_cores} "
        f"workers ({len(groups)} passes) the largest pass {passes[-1] * per_value / 1e9:.1f} GB, at most "
        f"{at_once * per_value / 1e9:.1f} GB for all workers at once.",
    ]
    print("\n".join(lines))


def kernel(kind: str, start: float) -> dict:
    """A fixed amount of single-threaded work, begun at the wall-clock time ``start`` (so that processes
    started together overlap exactly): ``compute`` (a Python loop, no memory traffic), ``sort`` (numpy's
    vectorised sort of arrays that fit in the core's cache, as the metadata pass's ``np.unique``) or
    ``memory`` (copying 256 MB arrays, 10 GB in all). Returns its wall seconds."""
    if kind == "memory":
        source = np.ones(32 << 20)  # 256 MB
        target = np.empty_like(source)
    elif kind == "sort":
        keys = np.random.default_rng(0).integers(0, 1 << 40, 1 << 16)  # 512 KB
    time.sleep(max(0.0, start - time.time()))
    started = time.perf_counter()
    if kind == "compute":
        total = 0
        for i in range(60_000_000):
            total += i & 7
    elif kind == "sort":
        for _ in range(1500):
            np.sort(keys)
    else:
        for _ in range(40):
            np.copyto(target, source)
    return {"wall": time.perf_counter() - started}


def machine_ceiling(repeats: int = 3, processes: int = 2) -> dict:
    """How much faster ``processes`` single-threaded processes do that many times the work than one process
    does it once, for each ``kernel`` (best of ``repeats``): the most that many workers can gain on this
    machine (``processes`` on free, independent cores; less when the cores are hyperthreads, shared with
    other guests, or short of memory bandwidth)."""
    ceiling = {}
    for kind in ("compute", "sort", "memory"):
        walls = {1: [], processes: []}
        for _ in range(repeats):
            for count in walls:
                start = str(time.time() + 1.0)
                runs = [
                    subprocess.Popen([*child_command(__spec__.name), "--kernel", kind, start], stdout=subprocess.PIPE)
                    for _ in range(count)
                ]
                walls[count].append(max(json.loads(run.communicate()[0])["wall"] for run in runs))
        ceiling[kind] = processes * min(walls[1]) / min(walls[processes])
        ceiling[f"{kind}_spread"] = max(walls[1]) / min(walls[1])
    return ceiling


def _child(*args: str) -> dict:
    output = subprocess.run([*child_command(__spec__.name), *args], check=True, capture_output=True, text=True).stdout
    return json.loads(output.strip().splitlines()[-1])


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--days", "1", "--rows-per-day", "10000", "--workers", "1", "--distinct", "10000", "--repeats", "1"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--rows-per-day", type=int, default=500_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts to measure (1 added)")
    parser.add_argument(
        "--default", action="store_true", help="also measure the project's default worker rule (workers: null)"
    )
    parser.add_argument("--distinct", type=int, default=20_000_000)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each measurement; the fastest is kept")
    parser.add_argument("--measure", nargs=3, metavar=("STAGE", "WORKERS", "DATA"), help=argparse.SUPPRESS)
    parser.add_argument("--count-distinct", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--loader", help=argparse.SUPPRESS)
    parser.add_argument("--kernel", nargs=2, metavar=("KIND", "START"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        workers = None if args.measure[1] == "default" else int(args.measure[1])
        print(json.dumps(measure(args.measure[0], workers, Path(args.measure[2]))))
        return
    if args.loader:
        print(json.dumps(loader_rates(Path(args.loader))))
        return
    if args.kernel:
        print(json.dumps(kernel(args.kernel[0], float(args.kernel[1]))))
        return
    if args.count_distinct:
        print(json.dumps(count_distinct(args.count_distinct)))
        return

    from criteo_dlrm.data.raw import convert_days
    from criteo_dlrm.data.synthetic import write_days

    counts = sorted({1, *args.workers})
    if counts[0] < 1:
        parser.error("--workers must be >= 1")
    settings = [*counts, "default"] if args.default else counts

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        write_days(data / "raw", days=args.days, rows_per_day=args.rows_per_day, seed=0)
        raw = sorted((data / "raw").glob("day_*.gz"))
        convert_days([(path, data / "parquet" / f"{path.name.removesuffix('.gz')}.parquet") for path in raw])
        # Interleaved repeats, the fastest of each kept: on a shared machine the slow runs measure the neighbours.
        runs = {(stage, workers): [] for stage in STAGES for workers in settings}
        for _ in range(args.repeats):
            for stage, workers in runs:
                runs[(stage, workers)].append(_child("--measure", stage, str(workers), tmp))
        results = {key: min(measured, key=lambda r: r["wall"]) for key, measured in runs.items()}
        loading = _child("--loader", tmp)
    ceiling = machine_ceiling(args.repeats, counts[-1])
    cores = os.cpu_count()
    print(f"\n{args.days} days of {args.rows_per_day:,} rows (gzip), {cores} cores\n")
    table = Table("stage", "workers", "rows/s", "CPU busy (all cores)", "largest process (MB)", "all processes (MB)",
                  "speed-up", "slowest run / fastest")  # fmt: skip
    for stage in STAGES:
        for workers in settings:
            result = results[(stage, workers)]
            rate = result["rows"] / result["wall"]
            speedup = results[(stage, 1)]["wall"] / result["wall"]
            shown = f"default ({result['workers']})" if workers == "default" else workers
            slowest = max(r["wall"] for r in runs[(stage, workers)]) / result["wall"]
            table.row(stage, shown, f"{rate:,.0f}", f"{result['busy']:.0%}", f"{result['largest_rss'] >> 20:,}",
                      f"{result['total_rss'] >> 20:,}", f"{speedup:.2f}x", f"{slowest:.2f}")  # fmt: skip
    print(
        f"\nthis machine's ceiling for {counts[-1]} single-threaded processes over 1 (same work each, best of {args.repeats}): "
        f"pure computation {ceiling['compute']:.2f}x, vectorised sort in cache {ceiling['sort']:.2f}x, memory streaming "
        f"{ceiling['memory']:.2f}x (one process alone: slowest run {ceiling['compute_spread']:.2f}x / "
        f"{ceiling['sort_spread']:.2f}x / {ceiling['memory_spread']:.2f}x the fastest)"
    )
    print()
    table = Table("stored rows", "bytes per row", "training loader rows/s (batch 16,384, shuffled, memory-mapped)")
    for name, label in (
        ("int32", "int32 indices, float32 labels (before)"),
        ("packed", "packed indices, uint8 labels"),
    ):
        table.row(label, loading["bytes"][name], f"{loading['rates'][name]:,.0f}")
    counted = _child("--count-distinct", str(args.distinct))
    per_value = (counted["peak_rss"] - counted["baseline_rss"]) / counted["distinct"]
    print(
        f"\nmetadata memory: one feature with {counted['distinct']:,} distinct values peaks at "
        f"{counted['peak_rss'] >> 20:,} MB ({per_value:.0f} bytes per distinct value above the "
        f"{counted['baseline_rss'] >> 20:,} MB interpreter)"
    )
    print("\nProjection for Criteo 1TB on 16 cores:\n")
    project(results, per_value, cores, counts[-1])


if __name__ == "__main__":
    main()
