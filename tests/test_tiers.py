"""The tiers are decided by rule at collection (tests/tiers.py): a test that starts a process is slow."""

from tests import tiers


def test_a_test_is_slow_when_it_or_a_helper_of_its_module_starts_a_process(tmp_path):
    module = tmp_path / "test_example.py"
    module.write_text(
        "import subprocess\n\n"
        "def _kedro(project, *args):\n    return subprocess.run(['kedro', 'run', *args], cwd=project)\n\n"
        "def _twice(project):\n    return _kedro(project), _kedro(project)\n\n"
        "def _sum(values):\n    return sum(values)\n\n"
        "def test_runs_kedro(tmp_path):\n    _twice(tmp_path)\n\n"
        "def test_adds():\n    assert _sum([1, 2]) == 3\n"
    )
    assert tiers._slow_functions(str(module)) == {"_kedro", "_twice", "test_runs_kedro"}


def test_every_test_left_in_the_fast_tier_starts_no_process(request):
    """What this session keeps in the fast tier reads as fast to the rule (a hand mark cannot make it so)."""
    fast = [item for item in request.session.items if item.get_closest_marker("slow") is None]
    assert fast and not [item.nodeid for item in fast if tiers.is_slow(item)]


def test_the_readme_s_pytest_collects_at_least_400_fast_tests_and_no_kedro_run():
    import os
    import subprocess
    import sys

    from tests.conftest import PROJECT_ROOT

    env = {k: v for k, v in os.environ.items() if not k.startswith("CRITEO_DLRM_")}
    found = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider", "-n", "0"],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    collected = [line for line in found.stdout.splitlines() if "::" in line]
    assert len(collected) >= 400, found.stdout[-2000:]
    assert not [line for line in collected if "test_kedro_run_ends_with_one_summary_block" in line]


def test_a_caller_s_settings_do_not_reach_the_tests(tmp_path):
    """``CRITEO_DLRM_TRACKING=off pytest`` (or another MLflow server, another Kedro environment, another Python for
    Spark's workers in the shell) ran the tests against settings they were not written for: the tests start from the
    project's defaults. Run as ``.venv/bin/pytest`` without activating the environment, the tests that run ``kedro``
    by name (kedro-viz's, the MLflow UI's, the suggested command lines) did not find it."""
    import os
    import subprocess
    import sys
    import sysconfig

    from tests.conftest import PROJECT_ROOT

    probe = tmp_path / "test_probe.py"  # the suite's own conftest loaded as a plugin, as it is for tests/
    probe.write_text(
        "import os\n\n\ndef test_probe():\n"
        "    assert not [n for n in os.environ if n.startswith(('CRITEO_DLRM_TRACKING', 'KEDRO_ENV', 'MLFLOW_'))]\n"
        "    assert os.environ['CRITEO_DLRM_FAIL_ON_SKIP'] == '1'\n"
        "    assert 'PYSPARK_PYTHON' not in os.environ\n"
        "    import shutil, sysconfig\n"
        "    assert shutil.which('kedro') == os.path.join(sysconfig.get_path('scripts'), 'kedro')\n"
    )
    scripts = sysconfig.get_path("scripts")  # not activated: the environment's commands are not on the PATH
    path = os.pathsep.join(folder for folder in os.environ["PATH"].split(os.pathsep) if folder != scripts)
    env = os.environ | {
        "CRITEO_DLRM_TRACKING": "off",
        "KEDRO_ENV": "nowhere",
        "MLFLOW_TRACKING_URI": "http://127.0.0.1:9",
        "CRITEO_DLRM_FAIL_ON_SKIP": "1",
        "PYSPARK_PYTHON": "/usr/bin/python3",
        "PATH": path,
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest", str(probe)],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:]


def test_in_a_run_of_both_tiers_the_slow_tier_runs_first(request):
    """pytest-xdist hands out tests in the collected order: with the slow tier first, the two test processes end on
    the fast tier together (in file order a minute-long test near the end can keep one busy after the other is done)."""
    slow = [item.get_closest_marker("slow") is not None for item in request.session.items]
    assert slow == sorted(slow, reverse=True), [item.nodeid for item in request.session.items][:50]


def test_the_finished_run_the_tests_read_is_made_once_a_session_and_each_process_reads_a_copy(
    ran_project, tmp_path_factory, worker_id
):
    """``ran_project`` (a whole `kedro run`, 30-50 s on 2 cores) was made by every test process that used it."""
    from tests.conftest import session_folder

    session = session_folder(tmp_path_factory, worker_id)
    made = session / "ran_project"
    assert (session / "ran_project.finished").exists() and (made / "data/06_models/dlrm_checkpoint.pt").is_dir()
    assert ran_project != made and ran_project.is_relative_to(tmp_path_factory.getbasetemp()), "this process's copy"
    versions = sorted(p.name for p in (ran_project / "data/06_models/dlrm_checkpoint.pt").iterdir())
    assert versions == sorted(p.name for p in (made / "data/06_models/dlrm_checkpoint.pt").iterdir())
