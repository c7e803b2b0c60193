"""The local engine's tasks on Spark: the same Parquet days, rejects and encoded files; Spark's retries."""

from __future__ import annotations

import filecmp
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from criteo_dlrm.common.errors import UserError
from criteo_dlrm.config import MetadataConfig
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.data.parquet import DayRows
from criteo_dlrm.data.raw import IngestionError, convert_days
from criteo_dlrm.data.synthetic import ClickModel, write_day
from criteo_dlrm.spark.tasks import run_on_spark
from tests.data.raw.samples import file_with_bad_lines


def _square_plus(shared, value):
    return shared + value * value


def test_results_come_back_in_task_order_with_the_shared_object(spark):
    assert list(run_on_spark(_square_plus, [(3,), (1,), (2,)], shared=10)) == [(0, 19), (1, 11), (2, 14)]
    assert list(run_on_spark(_square_plus, [], shared=10)) == []


def test_a_failed_task_is_retried_by_spark_and_a_user_error_is_raised_once(spark, tmp_path):
    attempts = tmp_path / "attempts"
    attempts.mkdir()

    def flaky(index):  # nested: Spark's pickler sends it by value, as a test module is not on the workers' path
        from pyspark import TaskContext

        (attempts / f"{index}-{TaskContext.get().attemptNumber()}").touch()
        if index == 1 and TaskContext.get().attemptNumber() == 0:
            raise OSError("the executor lost its disk")  # a failure of the task, not of the data
        return index

    assert [result for _, result in run_on_spark(flaky, [(0,), (1,), (2,)])] == [0, 1, 2]
    assert sorted(path.name for path in attempts.iterdir()) == ["0-0", "1-0", "1-1", "2-0"]

    def refused(index):
        (attempts / f"refused-{index}").touch()
        raise UserError(f"day {index} is damaged: fetch it again")

    with pytest.raises(UserError, match="day 0 is damaged: fetch it again"):
        list(run_on_spark(refused, [(0,), (1,)]))
    # Each task ran once: a user error is the task's answer, not retried.
    assert sorted(path.name for path in attempts.glob("refused-*")) == ["refused-0", "refused-1"]


def _raw_days(folder: Path, ctr: float = 0.25) -> list[Path]:
    model = ClickModel(seed=5, ctr=ctr)
    paths = [folder / "day_0.gz", folder / "day_1", folder / "day_2.gz"]
    for day, path in enumerate(paths):
        write_day(path, 6_000 + 1_000 * day, day=day, model=model, chunk_rows=2_500)
    return paths


def _convert_both(sources: list[Path], tmp_path: Path, **options) -> tuple[list, list]:
    reports = []
    for engine, run in (("local", None), ("spark", run_on_spark)):
        pairs = [(source, tmp_path / engine / (source.name.split(".")[0] + ".parquet")) for source in sources]
        reports.append(convert_days(pairs, workers=1, **options, **({"run": run} if run else {})))
    return reports[0], reports[1]


def _same_days(local: list, spark: list) -> None:
    assert len(local) == len(spark)
    for mine, theirs in zip(local, spark, strict=True):
        assert Path(mine.parquet).name == Path(theirs.parquet).name
        first, second = pq.read_table(mine.parquet), pq.read_table(theirs.parquet)
        assert first.schema.equals(second.schema, check_metadata=True)
        assert first.equals(second)
        assert (mine.rows, mine.rejected) == (theirs.rows, theirs.rejected)
        if mine.rejects_file:
            assert Path(mine.rejects_file).read_text() == Path(theirs.rejects_file).read_text()


def test_spark_ingestion_writes_the_local_engines_parquet_days(spark, tmp_path):
    sources = _raw_days(tmp_path / "raw")
    local, on_spark = _convert_both(sources, tmp_path)
    _same_days(local, on_spark)
    assert [report.rows for report in on_spark] == [6_000, 7_000, 8_000]


def test_spark_ingestion_reuses_the_days_a_run_completed(spark, tmp_path):
    sources = _raw_days(tmp_path / "raw")
    pairs = [(source, tmp_path / "out" / f"day_{day}.parquet") for day, source in enumerate(sources)]
    convert_days(pairs, run=run_on_spark)
    stamps = [Path(destination).stat().st_mtime_ns for _, destination in pairs]
    again = convert_days(pairs, run=run_on_spark)
    assert [report.seconds for report in again] == [0.0, 0.0, 0.0]  # reused, not converted
    assert [Path(destination).stat().st_mtime_ns for _, destination in pairs] == stamps


def test_spark_ingestion_keeps_bad_lines_and_refuses_a_day_past_the_share_as_locally(spark, tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    file_with_bad_lines(raw / "day_0")
    local, on_spark = _convert_both([raw / "day_0"], tmp_path, max_reject_fraction=0.9)
    _same_days(local, on_spark)
    assert on_spark[0].rejected == 7
    errors = []
    for engine, run in (("local", {}), ("spark", {"run": run_on_spark})):
        with pytest.raises(IngestionError) as error:
            convert_days([(raw / "day_0", tmp_path / f"{engine}-strict" / "day_0.parquet")], **run)
        errors.append(str(error.value).replace(f"{engine}-strict", "<out>"))
        assert not (tmp_path / f"{engine}-strict" / "day_0.parquet").exists()  # nothing half-written
    assert errors[0] == errors[1]
    assert "line 2" in errors[1]


def test_the_real_criteo_rows_with_damaged_lines_give_the_local_engines_days_and_model_input(
    spark, real_data, tmp_path
):
    raw = tmp_path / "raw"
    raw.mkdir()
    sources = sorted(real_data.glob("*.tsv"))
    assert len(sources) == 3
    for source in sources:
        shutil.copy(source, raw / source.name)
    lines = (raw / sources[0].name).read_text().splitlines(keepends=True)
    lines[10] = "2" + lines[10][1:]  # a label that is not 0 or 1
    lines[500] = lines[500].replace("\t", "\tzz", 1)  # a count that is not an integer
    lines.insert(900, "\n")  # an empty line
    (raw / sources[0].name).write_text("".join(lines))
    copies = sorted(raw.glob("*.tsv"))
    local, on_spark = _convert_both(copies, tmp_path, max_reject_fraction=0.01)
    _same_days(local, on_spark)
    assert on_spark[0].rejected == 3  # the rejects files (line numbers, reasons, text) are equal too
    assert sum(report.rows for report in on_spark) == sum(1 for s in sources for _ in s.open()) - 2

    days = [report.parquet for report in on_spark]
    metadata, vocabularies = compute_feature_metadata(days[:2], MetadataConfig())
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    for engine, run in (("local", {}), ("spark", {"run": run_on_spark})):
        encoder.encode_days(days, into=tmp_path / f"encoded_{engine}", shuffle=True, **run)
    names = sorted(path.name for path in (tmp_path / "encoded_local").iterdir())
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "encoded_local", tmp_path / "encoded_spark", names, shallow=False)
    assert (mismatch, errors) == ([], [])


def test_spark_ingestion_splits_a_big_file_into_the_same_days(spark, tmp_path):
    source = tmp_path / "raw" / "train.txt"
    write_day(source, 5_000, day=0, model=ClickModel(seed=1))
    local, on_spark = _convert_both([source], tmp_path, rows_per_day=2_000)
    _same_days(local, on_spark)
    assert [report.rows for report in on_spark] == [2_000, 2_000, 1_000]


@pytest.mark.parametrize("shuffle", [False, True])
def test_spark_encoding_writes_the_local_engines_files(spark, tmp_path, shuffle):
    sources = _raw_days(tmp_path / "raw")
    days = [report.parquet for report in convert_days([(s, tmp_path / f"{i}.parquet") for i, s in enumerate(sources)])]
    metadata, vocabularies = compute_feature_metadata(days[:2], MetadataConfig(min_expected_clicks=0, min_frequency=2))
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    paths = [days[0], days[1], DayRows(days[2], 0, 3_000)]  # a validation day's first rows, as the split makes
    encoder.encode_days(paths, into=tmp_path / "local", workers=1, shuffle=shuffle)
    encoder.encode_days(paths, into=tmp_path / "spark", shuffle=shuffle, run=run_on_spark)
    names = sorted(path.name for path in (tmp_path / "local").iterdir())
    assert names == sorted(path.name for path in (tmp_path / "spark").iterdir())
    assert "sparse.npy" in names
    match, mismatch, errors = filecmp.cmpfiles(tmp_path / "local", tmp_path / "spark", names, shallow=False)
    assert (mismatch, errors) == ([], [])
    labels = np.load(tmp_path / "spark" / "labels.npy")
    assert len(labels) == 6_000 + 7_000 + 3_000


def test_a_task_that_fails_every_try_ends_the_job_with_its_own_error(spark):
    from criteo_dlrm.spark.tasks import SparkJobError

    def broken(index):
        raise OSError(f"/shared/data/day_{index}: Input/output error")

    with pytest.raises(SparkJobError) as error:
        list(run_on_spark(broken, [(0,)]))
    message = str(error.value)
    assert "Spark job broken (1 tasks on local[2,2]) failed after Spark's retries" in message
    assert "OSError: /shared/data/day_0: Input/output error, raised by the task on every try" in message
    assert "Fix what it names" in message and "then run the same command again" in message
    assert "the days already converted are reused" in message


@pytest.mark.parametrize(
    ("cause", "by_the_task"),
    [
        ("OSError: /shared/data/day_0: Input/output error", True),
        ("numpy.core._exceptions._ArrayMemoryError: Unable to allocate 8.0 GiB", True),
        ("org.apache.spark.SparkException: Job aborted due to stage failure: ExecutorLostFailure", False),
        ("java.lang.OutOfMemoryError: Java heap space", False),
        ("Job aborted due to stage failure: Task 3 in stage 1.0 failed 4 times", False),
    ],
)
def test_a_failed_job_s_message_tells_the_task_s_own_error_from_a_lost_executor(cause, by_the_task):
    """A Python exception raised on every try comes back on a rerun of the same input: fix it first; Spark's own
    (an executor lost or killed) may pass on a rerun as it is."""
    from criteo_dlrm.spark.tasks import _job_error

    message = str(_job_error("_convert_task", 24, "spark://head:7077", "python3", cause))
    assert message.startswith(
        f"Spark job _convert_task (24 tasks on spark://head:7077) failed after Spark's retries: {cause}"
    )
    assert ("Fix what it names" in message) is by_the_task
    assert ("say why; run the same command again" in message) is not by_the_task
    assert "nothing half-written is left" in message


def test_workers_that_cannot_import_the_project_name_the_executors_python_and_no_retry(spark):
    """An executor whose Python lacks the project (a cluster's default interpreter): the same command again cannot
    help, the setting that names the executors' Python does."""
    from criteo_dlrm.spark.tasks import SparkJobError

    def on_an_executor_without_the_project(index):
        import criteo_dlrm_not_installed_on_this_executor  # noqa: F401 - what a worker without the package raises

    with pytest.raises(SparkJobError) as error:
        list(run_on_spark(on_an_executor_without_the_project, [(0,)]))
    message = str(error.value)
    assert "its Python workers cannot import criteo_dlrm_not_installed_on_this_executor" in message
    assert f"(here: {sys.executable})" in message and "set spark.pyspark.python in conf/base/spark.yml" in message
    assert "run the same command again" not in message
    assert [str(fix) for fix in error.value.fixes] == ["kedro run --params=preprocessing.engine=local"]


def test_progress_bars_name_where_the_tasks_run():
    from criteo_dlrm.common.parallel import run_parallel, where_tasks_run

    assert where_tasks_run(run_parallel, 3) == "3 workers"
    assert where_tasks_run(run_on_spark, 3) == "Spark"  # not the local worker count Spark never uses
