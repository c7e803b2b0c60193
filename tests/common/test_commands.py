"""Suggested commands are the user's own command line with the fix merged in."""

import shlex

from criteo_dlrm.cli import invocation, split_params
from criteo_dlrm.common.commands import WHOLE_JOB, Invocation, current_invocation, invoked, kedro_run


def _typed(params: str, **options) -> Invocation:
    """What ``cli.run`` records for ``kedro run --params=<params>`` and ``options``."""
    return invocation({"params": split_params(None, None, params), **options})


def test_outside_a_run_the_command_is_the_fix_alone():
    assert kedro_run(params={"ingestion.rows_per_day": 1429}) == "kedro run --params=ingestion.rows_per_day=1429"
    assert kedro_run("training") == "kedro run --pipelines=training"


def test_the_fix_is_merged_into_every_argument_the_user_gave():
    typed = _typed(
        "ingestion.raw_dir=/data/kaggle,metadata.train_days=[day_0,day_1],training.seed=3",
        pipelines=("ingestion", "metadata"),
        load_versions={"feature_metadata": "2026-01-01T00.00.00.000Z"},
        env="cluster",
    )
    with invoked(typed):
        command = kedro_run(params={"ingestion.rows_per_day": 1429, "training.seed": 4})
    assert shlex.split(command) == [
        "kedro", "run", "--pipelines=ingestion,metadata",
        "--params=ingestion.raw_dir=/data/kaggle,metadata.train_days=[day_0,day_1],training.seed=4,"
        "ingestion.rows_per_day=1429",
        "--load-versions=feature_metadata:2026-01-01T00.00.00.000Z", "--env=cluster",
    ]  # fmt: skip
    assert "'--params=" in command, "a list's brackets are quoted for the shell"
    assert current_invocation() == Invocation(), "the invocation ends with its run"


def test_a_fix_that_names_pipelines_replaces_the_user_s_and_the_whole_job_drops_pinned_versions():
    typed = _typed("training.seed=3", pipelines=("evaluation",), load_versions={"dlrm_checkpoint": "v1"})
    with invoked(typed):
        assert kedro_run("ingestion") == (
            "kedro run --pipelines=ingestion --params=training.seed=3 --load-versions=dlrm_checkpoint:v1"
        )
        assert kedro_run(WHOLE_JOB) == "kedro run --params=training.seed=3"


def test_worker_processes_see_the_invocation_of_the_run_that_started_them():
    import subprocess
    import sys

    code = "from criteo_dlrm.common.commands import kedro_run; print(kedro_run(params={'a.b': 1}))"
    with invoked(_typed("ingestion.raw_dir=/data/x")):
        printed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert printed.strip() == "kedro run --params=ingestion.raw_dir=/data/x,a.b=1"
