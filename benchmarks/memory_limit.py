"""Encoding inside a memory limit: what a batch job's scheduler does to the stored shuffle, cold page cache, one run.

    sudo python -m benchmarks.memory_limit [--rows 16000000] [--limits-mb MB ...] [--baseline GIT_REF]
                                           [--timeout 600] [--out DIR]

4 generated gzip days (25% clicks; ``--rows`` is all of them) are ingested and counted once; then the training
days (3 of them) are encoded, stored shuffled (what ``kedro run`` does), by a fresh process placed in a cgroup-v1
memory group of its own (its workers inherit it; the limit counts the page cache, as Slurm's and Kubernetes'
do), the page cache dropped before each run. For each limit (none first; by default 3x and 1.5x the own memory
the unlimited run peaked at, then ``--limits-mb``), and for ``--baseline``'s code (a git ref of this repository, checked out into a
temporary worktree) beside the current one: the time, the bytes the run read from the disk (the kernel's
count for its processes: other processes' reads are not counted) per byte of Parquet read plus encoded rows written, the
group's peak (page cache included), and whether the stored rows are byte-identical to the unlimited run's.
A run still going after ``--timeout`` seconds is stopped and reported with what it had read by then.

Needs root (the memory group, dropping the page cache) and cgroup v1's memory controller.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

from benchmarks.harness import ROOT, Arguments, Table, child_command, cpu_model

MEMORY = Path("/sys/fs/cgroup/memory")
DAYS = 4
STORED = ("labels.npy", "dense.npy", "sparse.npy")


def prepare(data: Path, rows: int) -> None:
    """Generated days, ingested, and the training days' metadata (``metadata.json``, ``vocabularies.npz``)."""
    import numpy as np

    from criteo_dlrm.config.metadata import MetadataConfig
    from criteo_dlrm.data.metadata import compute_feature_metadata
    from criteo_dlrm.data.raw import convert_days
    from criteo_dlrm.data.synthetic import ClickModel, write_day

    raw, parquet = data / "raw", data / "parquet"
    raw.mkdir(parents=True)
    names = [f"day_{day}" for day in range(DAYS)]
    for day, name in enumerate(names):
        write_day(raw / f"{name}.gz", rows // DAYS, day=day, model=ClickModel(seed=3))
    convert_days([(raw / f"{name}.gz", parquet / f"{name}.parquet") for name in names])
    shutil.rmtree(raw)
    train = [str(parquet / f"{name}.parquet") for name in names[:-1]]
    metadata, vocabularies = compute_feature_metadata(
        [Path(path) for path in train], MetadataConfig(min_frequency=3), progress=False
    )
    (data / "metadata.json").write_text(json.dumps({"metadata": metadata.to_dict(), "train": train}))
    np.savez(data / "vocabularies.npz", **vocabularies)


def encode(data: Path, out: Path) -> None:
    """The stage measured: the training days encoded into ``out``, stored shuffled, workers as ``kedro run``'s."""
    import numpy as np

    from criteo_dlrm.data.encoding import FeatureEncoder
    from criteo_dlrm.data.feature_metadata import FeatureMetadata

    saved = json.loads((data / "metadata.json").read_text())
    with np.load(data / "vocabularies.npz") as archive:
        vocabularies = {name: archive[name] for name in archive.files}
    encoder = FeatureEncoder.from_metadata(FeatureMetadata.from_dict(saved["metadata"]), vocabularies)
    encoder.encode_days([Path(path) for path in saved["train"]], into=out, workers=None, shuffle=True)


def _disk_read_bytes(path: Path) -> int:
    """Bytes read so far from the block device holding ``path`` (all processes: the machine should be quiet)."""
    device = os.stat(path).st_dev
    major, minor = os.major(device), os.minor(device)
    for line in Path("/proc/diskstats").read_text().splitlines():
        fields = line.split()
        if int(fields[0]) == major and int(fields[1]) == minor:
            return int(fields[5]) * 512
    raise RuntimeError(f"/proc/diskstats has no device {major}:{minor} (the disk holding {path})")


def _children_read_bytes() -> int:
    """Bytes this process's finished children (and theirs, each reaped by its parent) read from disks: the
    kernel's count of blocks read for them (``getrusage``'s ``ru_inblock``, 512-byte units), not the page cache's
    hits."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_inblock * 512


def _own_group() -> Path:
    """This process's cgroup-v1 memory group (a job's own group, inside which a child group is made)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return MEMORY / path.lstrip("/")
    return MEMORY


def _anonymous(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0


class _GroupMemory(threading.Thread):
    """The peak of the summed own memory (RssAnon) of the group's processes, every 50 ms."""

    def __init__(self, group: Path) -> None:
        super().__init__(daemon=True)
        self.group, self.peak = group, 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(0.05):
            try:
                pids = [int(pid) for pid in (self.group / "cgroup.procs").read_text().split()]
            except OSError:
                return
            self.peak = max(self.peak, sum(_anonymous(pid) for pid in pids))

    def stop(self) -> None:
        self._done.set()
        self.join()


def in_memory_group(command: list[str], limit: int | None, timeout: float, where: Path, env: dict) -> dict:
    """Run ``command`` in a fresh process inside a memory group of its own (``limit`` bytes, or none), the page
    cache dropped first: its exit code (None: stopped after ``timeout`` seconds), time, the bytes its processes
    read from disks (a stopped run: the disk holding ``where``, all processes), the group's peak (page cache included), the peak of its processes' summed own memory
    and the end of its output. Whatever is left in the group afterwards (a stopped run, orphans) is killed."""
    group = _own_group() / f"criteo_dlrm_bench_{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        if limit:
            (group / "memory.limit_in_bytes").write_text(str(limit))
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3")
        read_before = _disk_read_bytes(where), _children_read_bytes()
        monitor = _GroupMemory(group)
        start = time.perf_counter()
        child = subprocess.Popen(
            command, cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=lambda: (group / "cgroup.procs").write_text(str(os.getpid())),
        )  # fmt: skip
        monitor.start()
        try:
            output, _ = child.communicate(timeout=timeout)
            code = child.returncode
        except subprocess.TimeoutExpired:
            code, output = None, ""
        seconds = time.perf_counter() - start
        disk_read = _disk_read_bytes(where) - read_before[0]
        monitor.stop()
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        child.wait()
        # The run's own reads (its workers' too, each reaped by its parent), whatever else the machine reads; a run
        # stopped at the timeout counts what the disk gave since it started.
        read = _children_read_bytes() - read_before[1] if code is not None else disk_read
        while (group / "cgroup.procs").read_text().strip():
            time.sleep(0.1)
        return {
            "code": code,
            "seconds": seconds,
            "read": read,
            "group_peak": int((group / "memory.max_usage_in_bytes").read_text()),
            "own_peak": monitor.peak,
            "tail": output[-3000:],
        }
    finally:
        group.rmdir()


def measured_run(src: Path, data: Path, out: Path, limit: int | None, timeout: float, startup: bool = False) -> dict:
    """``encode`` with ``src``'s code in a fresh process inside its own memory group, cold page cache (``startup``:
    the modules imported, nothing encoded)."""
    shutil.rmtree(out, ignore_errors=True)
    # ``src``'s package first; this benchmark's own module from this project (it is run by module name).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(src), str(ROOT))), "KEDRO_DISABLE_TELEMETRY": "1"}
    command = [*child_command(__spec__.name), "--startup" if startup else "--encode", str(data), str(out)]
    return in_memory_group(command, limit, timeout, data, env)


def stored_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for name in STORED:
        with open(folder / name, "rb") as handle:
            while block := handle.read(1 << 24):
                digest.update(block)
    return digest.hexdigest()


def _worktree(ref: str, where: Path) -> Path:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(where), ref], check=True,
                   capture_output=True)  # fmt: skip
    return where / "src"


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--rows", "100000"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--rows", type=int, default=16_000_000, help="rows of all 4 generated days")
    parser.add_argument("--limits-mb", type=int, nargs="*", default=[],
                        help="memory limits measured after 3x and 1.5x the unlimited run's own memory")  # fmt: skip
    parser.add_argument("--baseline", default=None, help="a git ref whose encoding is measured beside this one")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for the data, kept and reused by the next run (default: a temporary one)")  # fmt: skip
    parser.add_argument("--encode", nargs=2, help=argparse.SUPPRESS)  # internal: data folder, output folder
    parser.add_argument("--startup", nargs=2, help=argparse.SUPPRESS)  # internal: the same, importing only
    args = parser.parse_args()
    if args.encode:
        encode(Path(args.encode[0]), Path(args.encode[1]))
        return
    if args.startup:
        import criteo_dlrm.data.encoding  # noqa: F401
        import criteo_dlrm.data.metadata  # noqa: F401

        return
    if os.geteuid() != 0 or not MEMORY.is_dir():
        sys.exit("memory_limit.py needs root and cgroup v1's memory controller (/sys/fs/cgroup/memory)")
    print(f"CPU: {cpu_model()}, {os.cpu_count()} cores; page cache dropped before each run\n")
    base = args.out or Path(tempfile.mkdtemp(prefix="memory-limit-"))
    worktree = None
    try:
        data = base / "data"
        if not (data / "vocabularies.npz").exists():  # else prepared by an earlier run with this --out
            prepare(data, args.rows)
        parquet_bytes = sum((data / "parquet" / f"day_{day}.parquet").stat().st_size for day in range(DAYS - 1))
        codes = [("current", ROOT / "src")]
        if args.baseline:
            worktree = base / "baseline"
            codes.insert(0, (args.baseline, _worktree(args.baseline, worktree)))
        unlimited = measured_run(ROOT / "src", data, base / "reference", None, args.timeout)
        if unlimited["code"] != 0:
            raise RuntimeError(f"the unlimited run failed:\n{unlimited['tail']}")
        reference = stored_digest(base / "reference")
        encoded_bytes = sum((base / "reference" / name).stat().st_size for name in STORED)
        floor = unlimited["own_peak"]
        limits = [int(3 * floor), int(1.5 * floor), *(mb << 20 for mb in args.limits_mb)]
        startup = measured_run(ROOT / "src", data, base / "run", None, args.timeout, startup=True)["read"]
        rows = args.rows // DAYS * (DAYS - 1)
        print(f"{rows:,} training rows: {parquet_bytes / 1e9:.2f} GB of Parquet read, "
              f"{encoded_bytes / 1e9:.2f} GB of encoded rows written. The stage's own memory, unlimited: "
              f"{floor / 2**20:,.0f} MB (the limits are 3x and 1.5x that, then those asked for). Reads are "
              f"counted less {startup / 1e6:,.0f} MB, what a process importing the modules reads from a cold "
              "cache (Python's, numpy's, pyarrow's libraries)\n")  # fmt: skip
        table = Table("code", "memory limit (MB)", "seconds", "read from disk (GB)", "read per byte of Parquet + encoded",
                      "group peak, page cache included (MB)", "own memory peak (MB)", "stored rows",
                      align="lrrrrrrl")  # fmt: skip
        for name, src in codes:
            for limit in [None, *limits]:
                if name == "current" and limit is None:
                    got = unlimited
                else:
                    got = measured_run(src, data, base / "run", limit, args.timeout)
                if got["code"] == 0:
                    same = stored_digest(base / "reference" if got is unlimited else base / "run") == reference
                    outcome = "identical" if same else "DIFFERENT"
                elif got["code"] is None:
                    outcome = f"stopped after {args.timeout:.0f} s"
                else:
                    outcome = f"failed, exit {got['code']}"
                read = got["read"] - startup
                table.row(name, "none" if limit is None else f"{limit >> 20:,}", f"{got['seconds']:.1f}",
                          f"{read / 1e9:.2f}", f"{read / (parquet_bytes + encoded_bytes):.2f}",
                          f"{got['group_peak'] / 2**20:,.0f}", f"{got['own_peak'] / 2**20:,.0f}", outcome)  # fmt: skip
    finally:
        if worktree is not None:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(worktree)],
                           capture_output=True)  # fmt: skip
        if args.out is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
