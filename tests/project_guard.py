"""A pytest plugin: a test run that leaves files in the project's own ``data/`` fails, naming them (tests work in
their own folders; one left ``data/06_models/in_progress/best/dlrm_f.pt`` there, which a user's next run found)."""

from __future__ import annotations

from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[1] / "data"
_before: set[Path] | None = None


def _files() -> set[Path]:
    return {path for path in DATA.rglob("*") if path.is_file()}


def _controller(config: pytest.Config) -> bool:
    return not hasattr(config, "workerinput")  # pytest-xdist's workers have it: the run is judged once


def pytest_sessionstart(session: pytest.Session) -> None:
    global _before
    if _controller(session.config):
        _before = _files()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _before is None or not _controller(session.config):
        return
    left = sorted(_files() - _before)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.section("files the tests left in the project's data/", sep="=", red=True)
            for path in left:
                reporter.write_line(str(path.relative_to(DATA.parent)), red=True)
        if exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED
