"""Imports run one way: common knows no other part of the package; config knows no engine; the core no Kedro."""

import ast

import pytest

from tests.conftest import PROJECT_ROOT

PACKAGE = PROJECT_ROOT / "src" / "criteo_dlrm"
# A part may import (or name, as a module string) only the parts below it.
BELOW = {
    "common": set(),
    "config": {"common", "models"},
    "models": {"common"},
}


def _named(path) -> set[str]:
    """criteo_dlrm.<part> modules ``path`` imports or names as strings (a preload list, say)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("criteo_dlrm."):
            found.add(node.value)
    return {name.split(".")[1] for name in found if name.startswith("criteo_dlrm.") and name.count(".") >= 1}


@pytest.mark.parametrize("part", sorted(BELOW))
def test_a_lower_part_never_imports_or_names_a_higher_one(part):
    for path in (PACKAGE / part).rglob("*.py"):
        upward = _named(path) - BELOW[part] - {part}
        assert not upward, f"{path.relative_to(PROJECT_ROOT)} reaches up to {sorted(upward)}"
