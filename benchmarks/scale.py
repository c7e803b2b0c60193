"""Scale benchmark: how the training input and the whole pipeline grow with the rows, cold page cache, in one run.

    python -m benchmarks.scale [--loader-rows 1000000 10000000 40000000] [--batches 200]
                               [--pipeline-rows 1000000 4000000 16000000] [--steps 200] [--out DIR]

Part 1, the training loader: random encoded rows (Criteo 1TB's index widths) stored as this project stores them,
digests included; for each size, in a fresh process with the rows' files dropped from the page cache
(``posix_fadvise(DONTNEED)``), the time from opening the rows to the first shuffled batch of 16,384 rows, the rate
over ``--batches`` batches, the bytes read from storage per byte delivered (``/proc/self/io``) and the memory the
loader added (the peak of the process's own memory, RssAnon, over its value before opening; the page cache a
memory map shows in RSS is not counted), for the previous loader (a full per-epoch permutation of the
rows, each batch gathered from random rows, every file's digest checked before the first batch) and the current
one (``data.batches``: chunks read in order, digests checked per chunk), in one run.

Part 2, the whole pipeline: 4 generated gzip days (25% clicks; the sizes given are the rows of all days
together), ingestion of all of them, metadata and encoding (stored shuffled) of the first 3 (the training days),
then ``--steps`` training steps of conf/base's model from the stored rows; each stage's time, peak own memory (RssAnon) of the process
tree and the disk it wrote, so what grows with the rows and what stays flat shows, and the rate per row projects to Criteo 1TB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import Arguments, Table, child_command, cpu_model
from benchmarks.preprocessing import CRITEO_1TB_ROWS, CRITEO_1TB_TABLES

BATCH = 16_384


def read_bytes() -> int:
    """Bytes this process has read from storage (not from the page cache)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no read_bytes")


def drop_from_cache(folder: Path) -> None:
    """Evict ``folder``'s files from the page cache (clean pages: written and synced first)."""
    os.sync()
    for path in folder.iterdir():
        descriptor = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(descriptor, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(descriptor)


def write_rows(folder: Path, rows: int) -> None:
    """``rows`` random encoded rows as ``EncodedDays`` stores them (uint8 labels, float32 dense, packed indices,
    layout, index maxima, chunk digests), written in pieces of 1M rows."""
    from criteo_dlrm.data.chunk_digests import write_digests
    from criteo_dlrm.data.stored import LAYOUT, STORED_FORMAT, PackedIndices, index_widths, write_index_maxima

    folder.mkdir(parents=True)
    widths = index_widths(CRITEO_1TB_TABLES)
    (folder / LAYOUT).write_text(
        json.dumps({"format": STORED_FORMAT, "sparse_widths": widths, "row_order": "shuffled"})
    )
    labels = np.lib.format.open_memmap(folder / "labels.npy", "w+", np.uint8, (rows,))
    dense = np.lib.format.open_memmap(folder / "dense.npy", "w+", np.float32, (rows, 13))
    packed = np.lib.format.open_memmap(folder / "sparse.npy", "w+", np.uint8, (rows, sum(widths)))
    sparse = PackedIndices(packed, widths)
    rng = np.random.default_rng(0)
    sizes = np.array(CRITEO_1TB_TABLES)
    for start in range(0, rows, 1 << 20):
        end = min(start + (1 << 20), rows)
        labels[start:end] = rng.random(end - start) < 0.03
        dense[start:end] = rng.standard_normal((end - start, 13), dtype=np.float32)
        sparse[start:end] = (rng.random((end - start, 26)) * sizes).astype(np.int32)
    for array in (labels, dense, packed):
        array.flush()
    del labels, dense, packed, sparse
    write_index_maxima(folder, [size - 1 for size in CRITEO_1TB_TABLES])
    write_digests(folder)


def _previous_loader(folder: Path, batches: int):
    """The loader before chunks: every file's digest checked, a permutation of all rows, random gathers."""
    from criteo_dlrm.common.storage import file_digest
    from criteo_dlrm.data.stored import open_encoded

    for name in ("labels.npy", "dense.npy", "sparse.npy"):
        file_digest(folder / name)
    arrays = open_encoded(folder, verify=False)
    order = np.random.default_rng([0, 0]).permutation(len(arrays))
    for begin in range(0, min(len(arrays), batches * BATCH), BATCH):
        take = np.sort(order[begin : begin + BATCH])
        yield len(take), (arrays.labels[take], arrays.dense[take], arrays.sparse[take])


def _current_loader(folder: Path, batches: int, read_ahead: bool = False):
    from criteo_dlrm.data.batches import BatchLoader
    from criteo_dlrm.data.stored import open_encoded

    loader = BatchLoader(open_encoded(folder), BATCH, shuffle=True)
    for index, batch in enumerate(loader.batches(read_ahead=read_ahead)):
        if index == batches:
            return
        yield len(batch), batch


# The training loop's use of the loader, with a step that takes STEP_SECONDS and leaves the CPU to the loader's
# threads (as a GPU step does): batches prepared PREFETCH ahead in a thread (``data.batches.Prefetcher``).
STEP_SECONDS = 0.02  # 16,384 rows in 20 ms: 819,200 rows/s, a GPU's rate on Criteo 1TB-sized batches
PREFETCH = 2


def input_waits(folder: Path, batches: int, read_ahead: bool) -> dict:
    """Per step, how long the loop waited for its batch (the loader behind a ``Prefetcher``), in a fresh process
    with the rows' files dropped from the page cache."""
    from criteo_dlrm.data.batches import BatchLoader, Prefetcher
    from criteo_dlrm.data.stored import open_encoded

    drop_from_cache(folder)
    loader = BatchLoader(open_encoded(folder), BATCH, shuffle=True)
    waits = []
    with Prefetcher(loader.batches(read_ahead=read_ahead), PREFETCH) as prefetched:
        for _ in range(batches):
            tick = time.perf_counter()
            if next(prefetched, None) is None:
                break
            waits.append(time.perf_counter() - tick)
            time.sleep(STEP_SECONDS)
    steady = np.array(waits[1:])  # the first batch waits for the first window either way
    return {"waits_ms": float(steady.sum() * 1000), "steps_waiting": int((steady > 0.001).sum()),
            "longest_ms": float(steady.max(initial=0.0) * 1000), "steps": len(steady)}  # fmt: skip


def measure_loader(folder: Path, which: str, batches: int) -> dict:
    """One loader over ``folder``, in this (fresh) process, its files just dropped from the page cache."""
    import criteo_dlrm.data.batches  # noqa: F401 - imported before the baseline memory is read
    from criteo_dlrm.data.stored import bytes_per_row, open_encoded

    row_bytes = bytes_per_row(open_encoded(folder, verify=False))
    drop_from_cache(folder)
    memory = _AnonymousMemory()
    memory.start()
    read_before = read_bytes()
    start = time.perf_counter()
    if which == "previous":
        loader = _previous_loader(folder, batches)
    else:
        loader = _current_loader(folder, batches, read_ahead=which == "current, reading ahead")
    first, rows = None, 0
    for count, _ in loader:
        first = first or time.perf_counter() - start
        rows += count
    wall = time.perf_counter() - start
    read = read_bytes() - read_before
    memory.stop()
    return {
        "first_batch_s": first,
        "rows_per_s": rows / wall,
        "read_per_delivered": read / (rows * row_bytes),
        "memory_mb": memory.added / 1e6,
    }


def _anonymous(pid: int | str = "self") -> int:
    """A process's own memory (RssAnon): not the file pages a memory map shows in RSS, which are page cache."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:  # the process ended
        return 0
    raise RuntimeError(f"/proc/{pid}/status has no RssAnon")


class _TreeMemory(threading.Thread):
    """The peak of the own memory (RssAnon) of this process and every descendant (workers), every 50 ms."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.total = 0
        self._done = threading.Event()

    def run(self) -> None:
        import psutil

        me = psutil.Process()
        while True:
            pids = [me.pid, *(child.pid for child in me.children(recursive=True))]
            self.total = max(self.total, sum(_anonymous(pid) for pid in pids))
            if self._done.wait(0.05):
                return

    def stop(self) -> None:
        self._done.set()
        self.join()


class _AnonymousMemory(threading.Thread):
    """The peak of this process's own memory (RssAnon) above what it was at the start, sampled every 5 ms."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.baseline = self.peak = self._read()
        self._done = threading.Event()

    @staticmethod
    def _read() -> int:
        return _anonymous()

    def run(self) -> None:
        while not self._done.wait(0.005):
            self.peak = max(self.peak, self._read())

    def stop(self) -> None:
        self._done.set()
        self.join()
        self.peak = max(self.peak, self._read())

    @property
    def added(self) -> int:
        return self.peak - self.baseline


def _fresh(*args: str) -> dict:
    result = subprocess.run([*child_command(__spec__.name), *args], capture_output=True, text=True)
    if result.returncode:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def pipeline(data: Path, rows: int, steps: int) -> dict:
    """Each stage of the whole job on ``rows`` generated rows (4 days), in this process and its workers."""
    from criteo_dlrm.config.metadata import MetadataConfig
    from criteo_dlrm.config.training import TrainingConfig
    from criteo_dlrm.data.batches import BatchLoader
    from criteo_dlrm.data.chunk_digests import write_digests
    from criteo_dlrm.data.encoding import FeatureEncoder
    from criteo_dlrm.data.metadata import compute_feature_metadata
    from criteo_dlrm.data.raw import convert_days
    from criteo_dlrm.data.stored import open_encoded
    from criteo_dlrm.data.synthetic import ClickModel, write_day
    from criteo_dlrm.engine.parallel.modes import build_mode
    from criteo_dlrm.engine.training.step import TrainStep

    days = 4
    raw = data / "raw"
    raw.mkdir(parents=True)
    for day in range(days):
        write_day(raw / f"day_{day}.gz", rows // days, day=day, model=ClickModel(seed=3))
    stages: dict[str, dict] = {}

    def stage(name: str, folder: Path | None, work, rows: int | None):
        monitor = _TreeMemory()
        monitor.start()
        start = time.perf_counter()
        result = work()
        stages[name] = {"seconds": time.perf_counter() - start, "rows": rows}
        monitor.stop()
        stages[name]["peak_mb"] = monitor.total / 1e6
        stages[name]["disk_mb"] = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) / 1e6 if folder else 0
        return result

    parquet = data / "parquet"
    names = [f"day_{day}" for day in range(days)]
    pairs = [(raw / f"{n}.gz", parquet / f"{n}.parquet") for n in names]
    stage("ingestion", parquet, lambda: convert_days(pairs), rows)
    train = [parquet / f"{n}.parquet" for n in names[:-1]]
    train_rows = rows // days * (days - 1)
    metadata, vocabularies = stage(
        "metadata",
        None,
        lambda: compute_feature_metadata(train, MetadataConfig(min_frequency=3), progress=False),
        train_rows,
    )
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    encoded = data / "encoded"

    def encode():
        encoder.encode_days(train, into=encoded, workers=None, shuffle=True)
        write_digests(encoded)

    stage("encoding", encoded, encode, train_rows)
    import yaml

    conf = Path(__file__).resolve().parents[1] / "conf" / "base" / "parameters_training.yml"
    config = TrainingConfig.from_dict(yaml.safe_load(conf.read_text())["training"])  # what `kedro run` trains
    sizes = metadata.table_sizes

    def train_steps():
        import torch

        torch.manual_seed(0)
        model_config = config.model_config(sizes, metadata.click_rate)
        step = TrainStep(build_mode(model_config, config, torch.device("cpu")), config)
        loader = BatchLoader(open_encoded(encoded), config.batch_size.train, shuffle=True)
        for index, batch in enumerate(loader.batches()):
            if index == steps:
                break
            step(batch, index, steps)

    stage(f"training ({steps} steps)", None, train_steps, steps * config.batch_size.train)
    return {"rows": rows, "stages": stages}


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--loader-rows", "100000", "--batches", "3", "--pipeline-rows", "40000", "--steps", "3"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--loader-rows", type=int, nargs="*", default=[1_000_000, 10_000_000, 40_000_000])
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--pipeline-rows", type=int, nargs="*", default=[1_000_000, 4_000_000, 16_000_000])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument(
        "--out", type=Path, default=None, help="folder for the generated data (default: a temporary one)"
    )
    parser.add_argument("--measure", nargs=3, help=argparse.SUPPRESS)  # internal: folder, loader, batches
    parser.add_argument("--waits", nargs=3, help=argparse.SUPPRESS)  # internal: folder, read ahead, batches
    parser.add_argument("--pipeline", nargs=3, help=argparse.SUPPRESS)  # internal: folder, rows, steps
    args = parser.parse_args()
    if args.measure:
        print(json.dumps(measure_loader(Path(args.measure[0]), args.measure[1], int(args.measure[2]))))
        return
    if args.waits:
        print(json.dumps(input_waits(Path(args.waits[0]), int(args.waits[2]), args.waits[1] == "ahead")))
        return
    if args.pipeline:
        print(json.dumps(pipeline(Path(args.pipeline[0]), int(args.pipeline[1]), int(args.pipeline[2]))))
        return
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; page cache dropped before each loader measurement\n")
    base = args.out or Path(tempfile.mkdtemp(prefix="scale-"))
    try:
        if args.loader_rows:
            print(f"Training loader, shuffled batches of {BATCH:,} rows, first {args.batches} batches, cold cache:\n")
            table = Table("rows", "loader", "first batch (s)", "rows/s", "bytes read per byte delivered",
                          "memory added (MB)", align="rlrrrr")  # fmt: skip
            waits = {}
            for rows in args.loader_rows:
                folder = base / f"rows_{rows}"
                write_rows(folder, rows)
                for which in ("previous", "current", "current, reading ahead"):
                    got = _fresh("--measure", str(folder), which, str(args.batches))
                    table.row(f"{rows:,}", which, f"{got['first_batch_s']:.2f}", f"{got['rows_per_s']:,.0f}",
                              f"{got['read_per_delivered']:.2f}", f"{got['memory_mb']:,.0f}")  # fmt: skip
                waits[rows] = {
                    ahead: _fresh("--waits", str(folder), ahead, str(args.batches)) for ahead in ("one", "ahead")
                }
                shutil.rmtree(folder)
            print(
                f"\nThe loop's wait for its batch, steps of {STEP_SECONDS * 1000:.0f} ms (the CPU left to the loader, as "
                f"on a GPU), {PREFETCH} batches prefetched, cold cache, after the first batch:\n"
            )
            table = Table("rows", "windows read", "steps", "steps that waited (> 1 ms)", "waited in all (ms)",
                          "longest wait (ms)", align="rlrrrr")  # fmt: skip
            for rows, both in waits.items():
                for ahead, got in both.items():
                    how = "one at a time" if ahead == "one" else "the next one ahead"
                    table.row(f"{rows:,}", how, got["steps"], got["steps_waiting"], f"{got['waits_ms']:,.0f}",
                              f"{got['longest_ms']:,.0f}")  # fmt: skip
        if args.pipeline_rows:
            print("\nWhole pipeline (4 generated gzip days; training rows: 3 of them), cold start:\n")
            table = Table("rows", "stage", "rows it read", "seconds", "rows/s",
                          "peak own memory (RssAnon), process tree (MB)", "disk written (MB)", align="rlrrrrr")  # fmt: skip
            for rows in args.pipeline_rows:
                folder = base / f"pipeline_{rows}"
                got = _fresh("--pipeline", str(folder), str(rows), str(args.steps))
                for name, stage in got["stages"].items():
                    table.row(f"{rows:,}", name, f"{stage['rows']:,}", f"{stage['seconds']:.1f}",
                              f"{stage['rows'] / stage['seconds']:,.0f}", f"{stage['peak_mb']:,.0f}",
                              f"{stage['disk_mb']:,.0f}")  # fmt: skip
                shutil.rmtree(folder)
            print(f"\nCriteo 1TB: {CRITEO_1TB_ROWS:,} rows. The process tree includes this benchmark's own process.")
    finally:
        if args.out is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
