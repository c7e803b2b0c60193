"""The install commands the README and the docs give are the ones that work here and in CI."""

import re
import tomllib

from packaging.specifiers import SpecifierSet

from tests.conftest import PROJECT_ROOT


def _block_after(text: str, heading: str) -> list[str]:
    return re.search(rf"{heading}.*?```bash\n(.*?)```", text, re.DOTALL).group(1).splitlines()


def test_the_cpu_install_pins_cis_torch_before_the_project_install():
    ci = (PROJECT_ROOT / ".ci" / "run").read_text()
    pinned = re.search(r'pip install -q "torch==([0-9.]+)"', ci).group(1)
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    torch_range = next(d for d in project["dependencies"] if d.startswith("torch")).removeprefix("torch")
    assert pinned in SpecifierSet(torch_range), "CI's CPU wheel satisfies the project's torch range"
    assert 'pip install -q -e ".[test]"' in ci, "CI installs what the README installs"
    for page, heading in (
        (PROJECT_ROOT / "README.md", "## Install"),
        (PROJECT_ROOT / "docs/getting-started.md", "## Install"),
    ):
        block = _block_after(page.read_text(), heading)
        assert block == [
            f'pip install "torch=={pinned}" --index-url https://download.pytorch.org/whl/cpu',
            'pip install -e ".[test]"',
        ], page
        gpu = _block_after(page.read_text(), "(?:With an NVIDIA GPU|On a machine with an NVIDIA GPU)")
        assert gpu[0].startswith(f'pip install "torch=={pinned}" --index-url https://download.pytorch.org/whl/cu')


def test_torchrec_cpu_install_is_what_ci_installs():
    page = (PROJECT_ROOT / "docs" / "torchrec.md").read_text()
    block = _block_after(page, "TorchRec on CPU")
    ci = (PROJECT_ROOT / ".ci" / "run").read_text()
    assert block[0] == 'pip install "torch==2.13.0" "fbgemm-gpu-cpu==1.8.0"'
    assert 'pip install -q "torch==2.13.0"' in ci and 'pip install -q "fbgemm-gpu-cpu==1.8.0"' in ci
    for line in block[1:]:
        assert line.replace("pip install ", "pip install -q ", 1) in ci, line


def test_the_readme_stays_a_front_door():
    readme = (PROJECT_ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (PROJECT_ROOT / link).exists(), link


def test_torchrec_s_install_refusal_points_to_a_section_that_exists():
    from criteo_dlrm.engine.parallel.sharding import INSTALL_HINT

    page, section = re.search(r"\((docs/[\w.]+), '([^']+)'\)", INSTALL_HINT).groups()
    assert f"## {section}\n" in (PROJECT_ROOT / page).read_text(), (page, section)
