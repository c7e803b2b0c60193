"""A pytest plugin for CI: with ``CRITEO_DLRM_FAIL_ON_SKIP=1`` a run that skipped any test not marked
``gpu`` fails, so a missing ``../shared/data/criteo_real/`` or a failed Chromium install turns CI red
instead of passing quietly."""

from __future__ import annotations

import os

import pytest

ENV = "CRITEO_DLRM_FAIL_ON_SKIP"
_skipped: list[pytest.TestReport] = []


def _unexpected() -> list[pytest.TestReport]:
    return [report for report in _skipped if "gpu" not in report.keywords]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if os.environ.get(ENV) == "1" and _unexpected():
        terminalreporter.section("skipped tests that CI must run", sep="=", red=True)
        for report in _unexpected():
            reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else str(report.longrepr)
            terminalreporter.write_line(f"{report.nodeid}: {reason}", red=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get(ENV) == "1" and _unexpected() and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
