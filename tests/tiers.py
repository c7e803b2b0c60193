"""The test tiers, decided at collection by a rule, not by hand: ``pytest`` runs the fast tier, ``pytest --full`` every
test (what CI runs, .ci/run).

A test is slow when it starts processes: ``kedro`` (a command, a ``KedroSession``, the project fixtures that run
one), a JVM (Spark), training or worker processes (``nproc_per_node``, spawn, torchrun), any subprocess, a memory
cgroup, a notebook's kernel or a browser; or when it calls a function of its own module, or uses a fixture, that
does; or when it is marked ``slow`` (a test whose own work takes long: the benchmarks at their smallest). The rule
reads the test's source, so a new test that starts ``kedro`` is slow without anyone marking it.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from functools import cache

import pytest

# What in a test's (or its helpers', or its fixtures') source starts a process or a long run.
STARTS_PROCESSES = re.compile(
    r"\bsubprocess\b|Popen|KedroSession|_kedro\(|\bkedro_run\b|nproc_per_node|\bspawn\b|torchrun|elastic_launch"
    r"|needs_spark|pyspark|SparkSession|cgroup|nbconvert|headless_dom|served\(|--smallest|run_training\("
)
# Fixtures that start one: the project copies that run kedro.
SLOW_FIXTURES = {"project", "ran_project", "nccl_like_processes"}


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true", help="run every test, the slow tier too (CI: .ci/run)")


@cache
def _module_functions(path: str) -> dict[str, str]:
    """Each module-level function's source in ``path``, by name."""
    with open(path) as handle:
        source = handle.read()
    tree = ast.parse(source)
    return {
        node.name: ast.get_source_segment(source, node) or ""
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }


@cache
def _slow_functions(path: str) -> frozenset[str]:
    """The module's functions that start processes, themselves or through another of the module's functions."""
    functions = _module_functions(path)
    slow = {name for name, source in functions.items() if STARTS_PROCESSES.search(source)}
    changed = True
    while changed:
        changed = False
        for name, source in functions.items():
            if name not in slow and any(re.search(rf"\b{re.escape(other)}\(", source) for other in slow):
                slow.add(name)
                changed = True
    return frozenset(slow)


def _fixture_is_slow(item: pytest.Item, name: str) -> bool:
    definitions = item._fixtureinfo.name2fixturedefs.get(name) or ()
    for definition in definitions:
        try:
            source = textwrap.dedent(inspect.getsource(definition.func))
        except (OSError, TypeError):
            continue
        if STARTS_PROCESSES.search(source):
            return True
    return False


def is_slow(item: pytest.Item) -> bool:
    """Whether ``item`` belongs to the slow tier (the module's rule)."""
    if item.get_closest_marker("slow") is not None:
        return True
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & SLOW_FIXTURES or any(_fixture_is_slow(item, name) for name in fixtures):
        return True
    function = getattr(item, "function", None)
    if function is None:
        return False
    path = str(item.path)
    source = _module_functions(path).get(function.__name__, "")
    if STARTS_PROCESSES.search(source):
        return True
    return any(re.search(rf"\b{re.escape(name)}\(", source) for name in _slow_functions(path))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow = [item for item in items if is_slow(item)]
    for item in slow:
        item.add_marker(pytest.mark.slow)
    chosen = set(map(id, slow))
    if config.getoption("--full") or config.getoption("markexpr"):
        # Every test, or the tiers a -m expression picks: the slow tier first (in its collection order), so the two
        # test processes end on the fast tests together, not one of them on a minute-long run while the other waits.
        items.sort(key=lambda item: id(item) not in chosen)
        return
    config.hook.pytest_deselected(items=[item for item in items if id(item) in chosen])
    items[:] = [item for item in items if id(item) not in chosen]
