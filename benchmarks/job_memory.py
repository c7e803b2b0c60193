"""Each stage's memory as ``kedro run`` runs it, and the smallest memory limit the whole job completes in.

    sudo python -m benchmarks.job_memory [--rows N] [--stages ...] [--limits-mb 0 2048 1700 1600 1024]
                                        [--encoding-limits-mb MB ...] [--params KEY=VALUE,...] [--out DIR]

A copy of the project (``conf/`` and the bundled sample; with ``--rows``, 3 generated gzip days of that many rows
in all instead), run as a user runs it (MLflow tracking on). First each pipeline in run order (ingestion,
metadata, training, evaluation, then scoring the sample's days), ``kedro run --pipelines=<name>`` in a cgroup-v1
memory group of its own, no limit, page cache dropped first: its time, the peak of the summed own memory
(RssAnon) of the group's processes (kedro, MLflow's, the workers) and the group's peak with the page cache. The
largest own peak is the job's floor. Then the whole ``kedro run`` on a fresh copy in groups of ``--limits-mb``
(0: none): whether it completes, its time, its own peak against the largest stage's, and how it ends when it
does not (the last line it printed). With
``--encoding-limits-mb`` (after the ingestion and metadata stages), encoding alone as a user runs it
(``kedro run --pipelines=training --nodes=encode_features``, its rows removed first) in each limit: whether it
completes, its time, its peaks, and the bytes its processes read from the disk
per byte of Parquet read plus encoded rows written.

Needs root (the memory groups, dropping the page cache) and cgroup v1's memory controller.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.harness import ROOT, Arguments, Table, describe_machine
from benchmarks.memory_limit import MEMORY, in_memory_group

STAGES = ("ingestion", "metadata", "training", "evaluation", "scoring")


def project_copy(where: Path, raw: Path) -> Path:
    """The project's configuration and ``raw``'s days in ``where`` (the package stays installed)."""
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    for name in ("pyproject.toml", ".telemetry"):
        shutil.copy(ROOT / name, where / name)
    shutil.copytree(ROOT / "conf", where / "conf", ignore=shutil.ignore_patterns("credentials.yml"))
    (where / "src").mkdir()
    shutil.copytree(raw, where / "data" / "01_raw", ignore=shutil.ignore_patterns(".gitkeep"))
    return where


def kedro(*args: str) -> list[str]:
    return [sys.executable, "-m", "kedro", "run", *args]


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--stages", "ingestion", "metadata", "--limits-mb", "--encoding-limits-mb", "1024"]


def _outcome(got: dict, timeout: float) -> str:
    if got["code"] == 0:
        return "completed"
    if got["code"] is None:
        return f"stopped after {timeout:.0f} s"
    lines = [line for line in got["tail"].splitlines() if line.strip() and "Full traceback" not in line]
    return f"exit {got['code']}: {(lines or ['(no output)'])[-1][:300]}"


def _bytes(folder: Path, pattern: str) -> int:
    return sum(path.stat().st_size for path in folder.rglob(pattern) if path.is_file())


def encoding_in_limits(project: Path, limits_mb: list[int], timeout: float, env: dict) -> None:
    """``kedro run --pipelines=training --nodes=encode_features`` in ``project`` (ingested and counted) in each
    limit, the encoded rows removed first."""
    parquet = _bytes(project / "data" / "02_intermediate", "*.parquet")
    print(
        f"\nEncoding alone (kedro run --pipelines=training --nodes=encode_features), {parquet / 1e6:,.0f} MB of Parquet:\n"
    )
    table = Table(
        "memory limit (MB)", "outcome", "seconds", "own memory peak (MB)", "group peak (MB)",
        "bytes read per byte read + written", align="rlrrrr",
    )  # fmt: skip
    encoded = project / "data" / "05_model_input"
    for limit in (mb << 20 for mb in limits_mb):
        shutil.rmtree(encoded, ignore_errors=True)
        got = in_memory_group(kedro("--pipelines=training", "--nodes=encode_features"), limit, timeout, project, env)
        written = _bytes(encoded, "*.npy") if got["code"] == 0 else 0
        ratio = f"{got['read'] / (parquet + written):.2f}" if written else "-"
        table.row(f"{limit >> 20:,}", _outcome(got, timeout), f"{got['seconds']:.1f}", f"{got['own_peak'] / 2**20:,.0f}",
                  f"{got['group_peak'] / 2**20:,.0f}", ratio)  # fmt: skip
        time.sleep(1)


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--rows", type=int, default=None, help="generated rows in all (default: the bundled sample)")
    parser.add_argument("--stages", nargs="*", default=list(STAGES), choices=STAGES)
    parser.add_argument("--params", default=None, help="--params for every kedro run (e.g. training.max_steps=200)")
    parser.add_argument("--limits-mb", type=int, nargs="*", default=[0, 2048, 1700, 1600, 1024], help="0: no limit")
    parser.add_argument("--encoding-limits-mb", type=int, nargs="*", default=[])
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--out", type=Path, default=None, help="folder for the copies (default: a temporary one)")
    args = parser.parse_args()
    if os.geteuid() != 0 or not MEMORY.is_dir():
        sys.exit("job_memory.py needs root and cgroup v1's memory controller (/sys/fs/cgroup/memory)")
    base = args.out or Path(tempfile.mkdtemp(prefix="job-memory-"))
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1"}
    try:
        raw = ROOT / "data" / "01_raw"
        if args.rows:
            from criteo_dlrm.data.synthetic import write_days

            raw = base / f"raw_{args.rows}"
            if not (raw / "day_2.gz").exists():  # else written by an earlier run with this --out
                shutil.rmtree(raw, ignore_errors=True)
                write_days(raw, 3, args.rows // 3)
        what = f"{args.rows:,} generated rows in 3 gzip days" if args.rows else "the bundled sample (60,000 rows)"
        describe_machine()
        print(f"{os.cpu_count()} cores; {what}; page cache dropped before each run\n")
        table = Table(
            "stage", "seconds", "own memory peak, all its processes (MB)", "group peak, page cache included (MB)"
        )
        project = project_copy(base / "stages", raw)
        floor = 0
        for stage in args.stages:
            params = [args.params] if args.params else []
            if stage == "scoring":
                params.append(f"scoring.input_dir={project / 'data' / '01_raw'}")
            extra = [f"--params={','.join(params)}"] if params else []
            got = in_memory_group(kedro(f"--pipelines={stage}", *extra), None, args.timeout, project, env)
            if got["code"] != 0:
                raise RuntimeError(f"kedro run --pipelines={stage} failed:\n{got['tail']}")
            floor = max(floor, got["own_peak"])
            table.row(
                stage, f"{got['seconds']:.1f}", f"{got['own_peak'] / 2**20:,.0f}", f"{got['group_peak'] / 2**20:,.0f}"
            )
        if args.encoding_limits_mb:
            encoding_in_limits(project, args.encoding_limits_mb, args.timeout, env)
        print(f"\nThe largest stage's own peak: {floor / 2**20:,.0f} MB. The whole `kedro run` in memory limits:\n")
        table = Table(
            "memory limit (MB)", "outcome", "seconds", "own memory peak (MB)", "over the largest stage's (MB)",
            "group peak (MB)", align="rlrrrr",
        )  # fmt: skip
        for limit in (mb << 20 for mb in args.limits_mb):
            project = project_copy(base / "job", raw)
            got = in_memory_group(kedro(*([f"--params={args.params}"] if args.params else [])), limit, args.timeout,
                                  project, env)  # fmt: skip
            table.row(
                f"{limit >> 20:,}" if limit else "none",
                _outcome(got, args.timeout),
                f"{got['seconds']:.1f}",
                f"{got['own_peak'] / 2**20:,.0f}",
                f"{(got['own_peak'] - floor) / 2**20:+,.0f}" if floor else "-",
                f"{got['group_peak'] / 2**20:,.0f}",
            )
            time.sleep(1)
    finally:
        if args.out is None:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
