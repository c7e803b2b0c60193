"""loguru into Kedro's logging; the console prepared by Kedro's extension points, never at import."""

import logging
import os
import subprocess
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from loguru import logger

from criteo_dlrm.logs import bridge_loguru
from tests.conftest import PROJECT_ROOT, copy_project


def test_loguru_messages_reach_standard_logging_under_the_module_name(caplog):
    bridge_loguru()
    with caplog.at_level(logging.INFO):
        logger.info("hello {}", "kedro")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("tests.test_logs", "INFO", "hello kedro")
    ]


# What the console set-up changes: the project's warnings filters (other libraries add their own at import), the
# root logger's handlers, the captured warnings' filters.
_STATE = """
import logging, warnings
def state():
    ours = ("register_new_resolver", "PySpark does not")
    return (
        [f[1].pattern for f in warnings.filters if f[1] is not None and f[1].pattern.startswith(ours)],
        sorted(type(h).__name__ for h in logging.getLogger().handlers),
        [type(f).__name__ for f in logging.getLogger("py.warnings").filters],
    )
"""


def _run(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """``python args`` in ``cwd``, output piped, as a user's command runs."""
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _python(code: str, cwd: Path) -> subprocess.CompletedProcess:
    return _run(cwd, "-c", code)


def test_importing_the_settings_changes_no_warnings_filter_and_no_log_handler():
    code = _STATE + (
        "import kedro.framework.project\n"  # Kedro's logging from conf/logging.yml, as before any project import
        "before = state()\n"
        "import criteo_dlrm.settings\n"
        "after = state()\n"
        "assert after == before, (before, after)\n"
        "print(before)\n"
    )
    result = _python(code, PROJECT_ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "RichHandler" in result.stdout, "Kedro's handler, from the project's conf/logging.yml"


def test_the_kedro_init_entry_point_prepares_the_console_in_this_project_only(tmp_path):
    (point,) = [p for p in entry_points(group="kedro.init") if p.name == "criteo_dlrm"]
    assert point.value == "criteo_dlrm.logs:on_kedro_command"
    other = tmp_path / "other"
    (other / "src").mkdir(parents=True)
    (other / "pyproject.toml").write_text('[tool.kedro]\npackage_name = "other_project"\nproject_name = "other"\n')
    code = _STATE + (
        "import kedro.framework.project\n"
        "before = state()\n"
        "from criteo_dlrm.logs import on_kedro_command\n"
        "on_kedro_command()\n"
        "print('changed' if state() != before else 'unchanged', state())\n"
    )
    ours = copy_project(tmp_path / "ours")
    last = {}
    for where in (ours, ours / "conf", other, tmp_path):
        result = _python(code, where)
        assert result.returncode == 0, (where, result.stderr[-2000:])
        last[where] = result.stdout.strip().splitlines()[-1]
    assert last[ours].startswith("changed") and "ConsoleHandler" in last[ours], last[ours]
    assert "register_new_resolver" in last[ours] and "UnactionableWarnings" in last[ours], last[ours]
    assert last[ours / "conf"].startswith("changed"), "from a folder inside the project too"
    assert last[other].startswith("unchanged"), "another Kedro project's console is left alone"
    assert last[tmp_path].startswith("unchanged"), "outside any project"


@pytest.mark.parametrize(
    "how",
    [
        "notebook",  # %load_ext kedro.ipython: Kedro's reload_kedro, through settings.SESSION_CLASS
        "script",  # python -m criteo_dlrm, the criteo-dlrm script
    ],
)
def test_a_session_without_the_kedro_command_starts_without_the_known_warnings(tmp_path, how):
    project = copy_project(tmp_path / "project")
    if how == "notebook":
        (project / "notebooks").mkdir()
        cell = "%load_ext kedro.ipython\nprint('loaded', type(context).__name__, type(catalog).__name__)"
        result = _run(project / "notebooks", "-m", "IPython", "--no-banner", "--colors=nocolor", "-c", cell)
        assert result.returncode == 0 and "loaded KedroContext DataCatalog" in result.stdout, result.stderr[-3000:]
    else:
        result = _run(project, "-m", "criteo_dlrm", "--params=training.num_epoch=1")
        assert result.returncode == 1 and "did you mean training.num_epochs?" in result.stderr
        assert "INFO    Kedro project criteo_dlrm\n" in result.stdout, "one unwrapped line from the first"
    output = result.stdout + result.stderr
    assert "Add type hints" not in output and "\x1b[" not in output, output[-3000:]
    assert "register_new_resolver" not in output, output[-3000:]
