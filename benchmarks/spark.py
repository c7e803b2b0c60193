"""Spark engine benchmark: ingestion, metadata and encoding on the local engine and on Spark, the same days, one run.

    python -m benchmarks.spark [--days 4] [--rows-per-day 250000] [--master "local[2]"] [--repeats 2]
                               [--executor-cores 64 256 1024] [--together]

Generates D gzip days, then runs each stage with each engine, each measurement in a fresh process (``--repeats``
interleaved runs, the fastest kept; ``--together``: each engine's three stages in one process, one Spark session
start instead of three): the local engine with its default workers, and Spark on ``--master`` (its session started
before the clock, and its start timed apart). Prints each stage's rows/s, CPU busy share (from
/proc/stat: run it on a quiet machine), the peak RSS of the whole process tree (for Spark: the driver, its JVM and
the Python workers) and Spark's time over the local engine's; checks that both engines wrote the same Parquet days,
metadata and encoded files; and projects Criteo 1TB on ``--executor-cores`` Spark cores from Spark's measured rate
per busy core, beside the local engine's on one 16-core machine.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import Arguments, Table, child_command, cpu_model
from benchmarks.preprocessing import CRITEO_1TB_ROWS, STAGES, measured

# Ingestion and encoding are one Spark task per day (gzip is not splittable; the stored layout is written per day):
# Criteo 1TB's 24 days, each task keeping about 2 cores busy (the local engine's CONVERSION_CORES, ENCODING_CORES).
DAY_TASKS = ("ingestion", "encoding")
DAY_TASKS_CORES = 24 * 2
SESSION = {"spark.sql.shuffle.partitions": "8", "spark.ui.enabled": "false"}


def measure(stage: str, engine: str, data: Path, master: str) -> dict:
    """Run one stage with ``engine`` in this (fresh) process."""
    from criteo_dlrm.config.metadata import MetadataConfig
    from criteo_dlrm.data.encoding import FeatureEncoder
    from criteo_dlrm.data.feature_metadata import FeatureMetadata
    from criteo_dlrm.data.parquet import count_rows
    from criteo_dlrm.data.raw import convert_days
    from criteo_dlrm.spark.engines import preprocessing_engine

    session_seconds, chosen = 0.0, preprocessing_engine({"engine": engine})
    if engine == "spark":
        from criteo_dlrm.spark.session import spark_session

        started = time.perf_counter()
        spark_session({**SESSION, "spark.master": master}).range(1).count()  # the JVM up and one job run
        session_seconds = time.perf_counter() - started
    raw = sorted(data.glob("raw/day_*.gz"))
    parquet = [data / "parquet" / f"{path.name.removesuffix('.gz')}.parquet" for path in raw]
    config = MetadataConfig()
    run = chosen.run
    if stage == "encoding":
        metadata = FeatureMetadata.from_dict(json.loads((data / "metadata.json").read_text()))
        encoder = FeatureEncoder.from_metadata(metadata, dict(np.load(data / "vocabularies.npz")))
    rows = count_rows(parquet)
    output = data / f"{'encoded' if stage == 'encoding' else 'parquet'}_{engine}"
    if stage != "metadata":  # a repeat converts, never reuses (the stage's own output: the others' stay compared)
        shutil.rmtree(output, ignore_errors=True)
    if stage == "ingestion":
        pairs = [(s, output / p.name) for s, p in zip(raw, parquet, strict=True)]
        _, figures = measured(lambda: convert_days(pairs, run=run))
    elif stage == "metadata":
        (metadata, _), figures = measured(lambda: chosen.count_metadata(parquet, config))
        (data / f"metadata_{engine}.json").write_text(json.dumps(metadata.to_dict(), sort_keys=True))
    else:
        _, figures = measured(lambda: encoder.encode_days(parquet, into=output, workers=None, shuffle=True, run=run))
    return {"rows": rows, **figures, "session": session_seconds}


def _child(*args: str) -> dict:
    done = subprocess.run([*child_command(__spec__.name), *args], capture_output=True, text=True)
    if done.returncode != 0:  # the measurement's own last lines (its error), not a bare CalledProcessError
        raise SystemExit(f"benchmarks/spark.py: measuring {' '.join(args[1:3])} failed:\n" + done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def _same_outputs(data: Path) -> list[str]:
    import pyarrow.parquet as pq

    days = sorted((data / "parquet_local").glob("*.parquet"))
    problems = [] if days else ["Parquet: none written by the local engine"]  # never a vacuous comparison
    for day in days:
        if not pq.read_table(data / "parquet_spark" / day.name).equals(pq.read_table(day)):
            problems.append(f"Parquet {day.name}")
    if (data / "metadata_local.json").read_text() != (data / "metadata_spark.json").read_text():
        problems.append("feature metadata")
    names = sorted(path.name for path in (data / "encoded_local").iterdir())
    _, mismatch, errors = filecmp.cmpfiles(data / "encoded_local", data / "encoded_spark", names, shallow=False)
    problems += [f"encoded {name}" for name in mismatch + errors]
    return problems


# What the tests run (--smallest): this benchmark at its smallest sizes, each engine's stages in one process (one
# Spark session started, not three: the smallest run's figures are not compared).
SMALLEST = ["--days", "1", "--rows-per-day", "5000", "--repeats", "1", "--together"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--days", type=int, default=4)
    parser.add_argument("--rows-per-day", type=int, default=250_000)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeats", type=int, default=2, help="runs of each measurement; the fastest is kept")
    parser.add_argument("--executor-cores", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument(
        "--together", action="store_true", help="each engine's three stages in one process, not each in a fresh one"
    )
    parser.add_argument("--measure", nargs=4, metavar=("STAGE", "ENGINE", "DATA", "MASTER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:
        stage, engine, data, master = args.measure
        measured_here = {
            name: measure(name, engine, Path(data), master) for name in (STAGES if stage == "all" else [stage])
        }
        for result in measured_here.values():  # the session this process started (the later stages found it up)
            result["session"] = max(other["session"] for other in measured_here.values())
        print(json.dumps(measured_here))
        return
    from criteo_dlrm.common.errors import ConfigError
    from criteo_dlrm.spark.session import require_spark

    try:
        require_spark()
    except ConfigError as error:
        raise SystemExit(
            f"benchmarks/spark.py compares the Spark engine with the local one, and cannot: {error}"
        ) from None

    from criteo_dlrm.config.metadata import MetadataConfig
    from criteo_dlrm.data.metadata import compute_feature_metadata
    from criteo_dlrm.data.raw import convert_days
    from criteo_dlrm.data.synthetic import write_days

    engines = ("local", "spark")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp)
        write_days(data / "raw", days=args.days, rows_per_day=args.rows_per_day, seed=0)
        raw = sorted((data / "raw").glob("day_*.gz"))
        parquet = [data / "parquet" / f"{path.name.removesuffix('.gz')}.parquet" for path in raw]
        convert_days(list(zip(raw, parquet, strict=True)))
        metadata, vocabularies = compute_feature_metadata(parquet, MetadataConfig(), progress=False)
        (data / "metadata.json").write_text(json.dumps(metadata.to_dict()))
        np.savez(data / "vocabularies.npz", **vocabularies)
        runs = {(stage, engine): [] for stage in STAGES for engine in engines}
        for _ in range(args.repeats):  # interleaved: on a shared machine the slow runs measure the neighbours
            for stage, engine in [(None, engine) for engine in engines] if args.together else runs:
                for name, result in _child("--measure", stage or "all", engine, tmp, args.master).items():
                    runs[(name, engine)].append(result)
        results = {key: min(measured, key=lambda r: r["wall"]) for key, measured in runs.items()}
        problems = _same_outputs(data)
    cores = os.cpu_count()
    sessions = [result["session"] for (_, engine), result in results.items() if engine == "spark"]
    print(f"\n{cpu_model()}, {cores} cores; {args.days} gzip days of {args.rows_per_day:,} rows; Spark {args.master}\n")
    table = Table("stage", "engine", "rows/s", "CPU busy (all cores)", "all processes (MB)", "time / local engine's",
                  align="llrrrr")  # fmt: skip
    for stage in STAGES:
        for engine in engines:
            result = results[(stage, engine)]
            ratio = result["wall"] / results[(stage, "local")]["wall"]
            table.row(stage, engine, f"{result['rows'] / result['wall']:,.0f}", f"{result['busy']:.0%}",
                      f"{result['total_rss'] >> 20:,}", f"{ratio:.2f}x")  # fmt: skip
    print(
        f"\nSpark's session start (JVM and a first job, not in the table): {min(sessions):.1f} s. "
        + ("Both engines wrote the same Parquet days, metadata and encoded files." if not problems else
           f"DIFFERENT OUTPUTS: {', '.join(problems)}")
    )  # fmt: skip
    print("\nCriteo 1TB projected from the measured rates per busy core (hours; local: one 16-core machine):\n")
    table = Table("stage", "local, 16 cores", *(f"Spark, {count:,} cores" for count in args.executor_cores))
    totals = [0.0] * (1 + len(args.executor_cores))
    for stage in STAGES:
        cells = []
        for index, (engine, target) in enumerate([("local", 16)] + [("spark", c) for c in args.executor_cores]):
            result = results[(stage, engine)]
            per_core = result["rows"] / result["wall"] / max(result["busy"] * cores, 1e-9)
            if engine == "spark" and stage in DAY_TASKS:
                target = min(target, DAY_TASKS_CORES)  # one task per day: 24 days keep at most this many busy
            hours = CRITEO_1TB_ROWS / (per_core * target) / 3600
            totals[index] += hours
            cells.append(f"{hours:.2f}")
        table.row(stage, *cells)
    table.row("all three", *(f"{hours:.2f}" for hours in totals))
    print(
        f"\nA projection, not a measurement: it assumes the per-core rate holds on every executor and that the shared "
        f"filesystem keeps up; ingestion and encoding are one task per day, so on Criteo 1TB's 24 days they use at "
        f"most {DAY_TASKS_CORES} cores whatever the cluster; the vocabulary pass's shuffle and the network are not in it."
    )
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
