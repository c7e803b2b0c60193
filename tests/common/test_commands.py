"""Suggested commands are the user's own command line with the fix merged in; errors carry the fix as data."""

import pickle
import shlex
from concurrent.futures import ProcessPoolExecutor

from criteo_dlrm.cli import UserErrorExit, invocation, split_params
from criteo_dlrm.common.commands import Invocation, current_invocation, invoked
from criteo_dlrm.common.errors import WHOLE_JOB, DataError, Fix, Remedy
from criteo_dlrm.common.storage import DiskFullError


def _typed(params: str, **options) -> Invocation:
    """What ``cli.run`` records for ``kedro run --params=<params>`` and ``options``."""
    return invocation({"params": split_params(None, None, params), **options})


def test_outside_a_run_the_command_is_the_fix_alone():
    assert str(Fix(params={"ingestion.rows_per_day": 1429})) == "kedro run --params=ingestion.rows_per_day=1429"
    assert str(Fix(pipelines="training")) == "kedro run --pipelines=training"
    assert str(Fix(environment={"CRITEO_DLRM_TRACKING": "off"})) == "CRITEO_DLRM_TRACKING=off kedro run"


def test_the_fix_is_merged_into_every_argument_the_user_gave():
    typed = _typed(
        "ingestion.raw_dir=/data/kaggle,metadata.train_days=[day_0,day_1],training.seed=3",
        pipelines=("ingestion", "metadata"),
        load_versions={"feature_metadata": "2026-01-01T00.00.00.000Z"},
        env="cluster",
    )
    command = typed.command(Fix(params={"ingestion.rows_per_day": 1429, "training.seed": 4}))
    assert shlex.split(command) == [
        "kedro", "run", "--pipelines=ingestion,metadata",
        "--params=ingestion.raw_dir=/data/kaggle,metadata.train_days=[day_0,day_1],training.seed=4,"
        "ingestion.rows_per_day=1429",
        "--load-versions=feature_metadata:2026-01-01T00.00.00.000Z", "--env=cluster",
    ]  # fmt: skip
    assert "'--params=" in command, "a list's brackets are quoted for the shell"


def test_a_fix_that_names_pipelines_replaces_the_user_s_and_the_whole_job_drops_pinned_versions():
    typed = _typed("training.seed=3", pipelines=("evaluation",), load_versions={"dlrm_checkpoint": "v1"})
    assert typed.command(Fix(pipelines="ingestion")) == (
        "kedro run --pipelines=ingestion --params=training.seed=3 --load-versions=dlrm_checkpoint:v1"
    )
    assert typed.command(Fix(pipelines=WHOLE_JOB)) == "kedro run --params=training.seed=3"
    assert typed.command(Fix()) == (
        "kedro run --pipelines=evaluation --params=training.seed=3 --load-versions=dlrm_checkpoint:v1"
    ), "no change: the user's own command"


def test_a_default_of_the_fix_gives_way_to_the_user_s_own_value():
    fix = Fix(
        params={"training.embedding_optimizer": "rowwise_adagrad"}, defaults={"training.embedding_learning_rate": 0.05}
    )
    assert str(fix) == (
        "kedro run --params=training.embedding_optimizer=rowwise_adagrad,training.embedding_learning_rate=0.05"
    )
    assert _typed("training.embedding_learning_rate=0.2").command(fix) == (
        "kedro run --params=training.embedding_learning_rate=0.2,training.embedding_optimizer=rowwise_adagrad"
    )


def test_the_command_line_shows_each_fix_of_a_message_merged_and_leaves_the_rest_as_written():
    restore, whole = Fix(pipelines="ingestion", params={"ingestion.raw_dir": "/d"}), Fix(pipelines=WHOLE_JOB)
    message = f"day_0: gone; `touch x` then `{restore}`; otherwise `{whole}`. day_1: gone; `{whole}`, {{not a fix}}."
    error = DataError(message, fix=[restore, whole, whole])
    typed = _typed("training.seed=3", pipelines=("training",))
    shown = UserErrorExit(error, typed).message
    assert shown == (
        "DataError: day_0: gone; `touch x` then `kedro run --pipelines=ingestion "
        "--params=training.seed=3,ingestion.raw_dir=/d`; otherwise `kedro run --params=training.seed=3`. "
        "day_1: gone; `kedro run --params=training.seed=3`, {not a fix}."
    )
    assert str(error) == message, "outside a run (a notebook): the fixes alone, runnable as they are"
    assert UserErrorExit(error).message == f"DataError: {message}"


def test_a_remedy_gives_its_fix_and_plain_words_none():
    fix = Fix(pipelines="training")
    remedy = Remedy(f"Encode the rows again: `{fix}`.", fix)
    assert DataError(f"x. {remedy}", fix=remedy).fixes == (fix,)
    assert DataError("x. Delete the file.", fix="Delete the file.").fixes == ()


def _raise_in_worker(fix: Fix) -> None:
    raise DiskFullError(f"disk full: `{fix}`", fix=fix)


def test_an_error_raised_in_a_worker_process_arrives_with_its_fix():
    fix = Fix(params={"ingestion.raw_dir": "/data/x"})
    with ProcessPoolExecutor(1) as pool:
        error = pool.submit(_raise_in_worker, fix).exception()
    assert isinstance(error, DiskFullError) and isinstance(error, OSError)
    assert error.fixes == (fix,) and str(error) == f"disk full: `{fix}`"
    assert pickle.loads(pickle.dumps(error)).fixes == (fix,)


def test_the_invocation_is_known_only_inside_its_run():
    typed = _typed("training.seed=3")
    with invoked(typed):
        assert current_invocation() == typed
    assert current_invocation() == Invocation()
