"""The README's install commands are the ones that work here and in CI."""

import re
import tomllib

from packaging.specifiers import SpecifierSet

from tests.conftest import PROJECT_ROOT


def test_cpu_install_is_an_exact_command_that_fits_the_project():
    readme = (PROJECT_ROOT / "README.md").read_text()
    block = re.search(r"On a machine without a GPU.*?```bash\n(.*?)```", readme, re.DOTALL).group(1).splitlines()
    assert block == ["pip install torch --index-url https://download.pytorch.org/whl/cpu", 'pip install -e ".[test]"']
    ci = (PROJECT_ROOT / ".ci" / "run").read_text()
    pinned = re.search(r'pip install -q "torch==([0-9.]+)"', ci).group(1)
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    torch_range = next(d for d in project["dependencies"] if d.startswith("torch")).removeprefix("torch")
    assert pinned in SpecifierSet(torch_range), "CI's CPU wheel satisfies the project's torch range"
    assert 'pip install -q -e ".[test]"' in ci, "CI installs what the README installs"


def test_torchrec_cpu_install_is_what_ci_installs():
    readme = (PROJECT_ROOT / "README.md").read_text()
    block = re.search(r"TorchRec on CPU.*?```bash\n(.*?)```", readme, re.DOTALL).group(1).splitlines()
    ci = (PROJECT_ROOT / ".ci" / "run").read_text()
    assert block[0] == 'pip install "torch==2.13.0" "fbgemm-gpu-cpu==1.8.0"'
    assert 'pip install -q "torch==2.13.0"' in ci and 'pip install -q "fbgemm-gpu-cpu==1.8.0"' in ci
    for line in block[1:]:
        assert line.replace("pip install ", "pip install -q ", 1) in ci, line
