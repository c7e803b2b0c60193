"""CI's guard against quiet skips (``tests/skip_guard.py``), run on a throwaway test file."""

import os
import subprocess
import sys

from tests.conftest import PROJECT_ROOT

TESTS = """
import pytest

def test_runs():
    pass

@pytest.mark.gpu
def test_needs_a_gpu():
    pytest.skip("needs CUDA")

def test_needs_data():
    {data}
"""


def _pytest(tmp_path, data_line: str, fail_on_skip: bool) -> subprocess.CompletedProcess:
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: needs CUDA\n")
    (tmp_path / "test_sample.py").write_text(TESTS.format(data=data_line))
    env = {**os.environ, "CRITEO_DLRM_FAIL_ON_SKIP": "1" if fail_on_skip else "0"}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "tests.skip_guard", "-c", str(tmp_path / "pytest.ini"),
         "-p", "no:cacheprovider", str(tmp_path / "test_sample.py")],
        cwd=PROJECT_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_skipped_test_fails_the_ci_run_and_is_named(tmp_path):
    result = _pytest(tmp_path, 'pytest.skip("real Criteo sample not present")', fail_on_skip=True)
    assert result.returncode == 1, result.stdout
    assert "test_sample.py::test_needs_data: " in result.stdout and "real Criteo sample not present" in result.stdout
    assert "test_needs_a_gpu" not in result.stdout.split("skipped tests that CI must run")[1]


def test_gpu_skips_and_runs_outside_ci_pass(tmp_path):
    assert _pytest(tmp_path, "pass", fail_on_skip=True).returncode == 0, "a skipped gpu test is expected"
    assert _pytest(tmp_path, 'pytest.skip("no data")', fail_on_skip=False).returncode == 0, "users may lack the data"


def test_each_test_process_chooses_ports_of_its_own_below_the_kernel_s_ephemeral_range(monkeypatch):
    """A port a test chose and released is never handed to another test process, nor to a port-0 bind."""
    from tests.conftest import _ephemeral_start, unused_port

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    first = {unused_port() for _ in range(20)}
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    second = {unused_port() for _ in range(20)}
    assert len(first) == len(second) == 20, "a new port each call"
    assert max(first) < min(second) and max(second) < _ephemeral_start()


def test_a_port_one_test_process_chose_is_never_chosen_by_another_suite_s_process_of_the_same_name(monkeypatch):
    """Two suites at once both have a gw1: its ports are claimed machine-wide, so the other suite's gw1 (a process
    that starts counting from the same first port) is handed other ports."""
    import itertools

    import tests.conftest as conftest

    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    first = [conftest.unused_port() for _ in range(5)]
    monkeypatch.setattr(conftest, "_ports", itertools.count())  # another process of that name, counting afresh
    monkeypatch.setattr(conftest, "_claimed", [], raising=False)  # its own claims (the first stay held: kept)
    second = [conftest.unused_port() for _ in range(5)]
    assert not set(first) & set(second)
