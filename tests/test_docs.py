"""The docs site: it builds strictly, its home page renders, and the parameters reference matches conf/base."""

import os
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from tests.conftest import PROJECT_ROOT, headless_dom


def _leaves(values: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, value in values.items():
        if isinstance(value, dict) and value:
            keys += _leaves(value, f"{prefix}{key}.")
        else:
            keys.append(f"{prefix}{key}")
    return keys


def test_the_parameters_reference_has_a_row_for_every_key_and_no_other():
    page = (PROJECT_ROOT / "docs" / "parameters.md").read_text()
    sections = re.split(r"^## `(\w+)`$", page, flags=re.MULTILINE)
    documented = {
        name: re.findall(r"^\| `([^`]+)` \|", body, re.MULTILINE)
        for name, body in zip(sections[1::2], sections[2::2], strict=True)
    }
    shipped = {}
    for path in sorted((PROJECT_ROOT / "conf" / "base").glob("parameters_*.yml")):
        shipped.update(yaml.safe_load(path.read_text()))
    assert set(documented) == set(shipped)
    for section, values in shipped.items():
        keys = _leaves(values)
        assert sorted(documented[section]) == sorted(keys), section
        assert len(documented[section]) == len(set(documented[section])), f"{section}: a key documented twice"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=PROJECT_ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    return out


@pytest.mark.slow
def test_the_site_builds_with_every_page(site):
    nav = yaml.safe_load((PROJECT_ROOT / "mkdocs.yml").read_text())["nav"]
    pages = [next(iter(entry.values())) for entry in nav]
    assert sorted(pages) == sorted(p.name for p in (PROJECT_ROOT / "docs").glob("*.md")), "every page in the nav"
    for page in pages:
        built = site / ("index.html" if page == "index.md" else f"{page.removesuffix('.md')}/index.html")
        assert built.exists(), page


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="Debian's chromium is not installed")
def test_headless_chromium_renders_the_home_page(site, tmp_path):
    dom = headless_dom((site / "index.html").as_uri(), tmp_path / "profile", 5000, "--allow-file-access-from-files")
    assert "<title>criteo-dlrm</title>" in dom
    assert "Raw Criteo click logs in" in dom
    for page in ("Getting started", "Parameters reference", "Troubleshooting", "Benchmarks"):
        assert page in dom, page


def _numbered_items(markdown: str) -> list[int]:
    """The item count of each numbered list in a page's source (outside code fences)."""
    lists, current, fenced = [], 0, False
    for line in markdown.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if re.match(r"^\d+\. ", line):
            current += 1
        elif line and not line.startswith(" ") and current:
            lists.append(current)
            current = 0
    return [*lists, current] if current else lists


def test_every_numbered_list_renders_with_each_of_its_items(site):
    """A list item's continuation indented by 3 spaces passes `mkdocs build --strict` but merges the items after
    it into one paragraph: the built page must have as many list items as the source has."""
    pages = yaml.safe_load((PROJECT_ROOT / "mkdocs.yml").read_text())["nav"]
    for page in (next(iter(entry.values())) for entry in pages):
        expected = _numbered_items((PROJECT_ROOT / "docs" / page).read_text())
        built = site / ("index.html" if page == "index.md" else f"{page.removesuffix('.md')}/index.html")
        html = built.read_text()
        rendered = [len(re.findall(r"<li>", block)) for block in re.findall(r"<ol>(.*?)</ol>", html, re.DOTALL)]
        assert rendered == expected, (page, expected, rendered)


def test_the_home_page_links_every_page_of_the_navigation():
    home = (PROJECT_ROOT / "docs" / "index.md").read_text()
    pages = yaml.safe_load((PROJECT_ROOT / "mkdocs.yml").read_text())["nav"]
    for page in (next(iter(entry.values())) for entry in pages):
        assert page == "index.md" or f"]({page}" in home, page
