"""Every benchmark runs, at its smallest size, on the project as it is: a default or an API change cannot break
one unseen (three were: two built models with sizes the new defaults refuse, one compared with the former
table layout). Their figures are not checked here; the benchmarks page records them."""

import ast
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import PROJECT_ROOT
from tests.spark.conftest import needs_spark

BENCHMARKS = PROJECT_ROOT / "benchmarks"
# Each benchmark states its smallest run beside its parser (``SMALLEST``, run by ``--smallest``); these do not:
NOT_RUN = {
    # Its own test below reads each check's line.
    "gpu_smoke": "run by test_the_gpu_smoke_test_dry_runs_on_the_cpu_with_every_cuda_check_skipped",
    # The quality studies train to convergence on 100,000 rows at least (minutes on 2 cores); their settings are
    # built below instead, through TrainingConfig.from_dict, as training builds them.
    **{
        f"quality.{p.stem}": "trains to convergence"
        for p in (BENCHMARKS / "quality").glob("*.py")
        if p.stem not in ("__init__", "common")
    },
}
NEEDS_CGROUPS = ("memory_limit", "job_memory")  # each runs stages inside memory groups of its own


def _benchmarks() -> dict[str, bool]:
    """Every benchmark module (one with a ``main``), by its name under ``benchmarks.``: whether it states its
    smallest run."""
    found = {}
    for path in sorted(BENCHMARKS.rglob("*.py")):
        tree = ast.parse(path.read_text())
        if not any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body):
            continue
        name = ".".join(path.relative_to(BENCHMARKS).with_suffix("").parts)
        found[name] = any(
            isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SMALLEST" for t in node.targets)
            for node in tree.body
        )
    return found


def test_every_benchmark_states_its_smallest_run_or_why_the_tests_leave_it_out():
    benchmarks = _benchmarks()
    assert len(benchmarks) >= 20 and "training" in benchmarks and "quality.curve" in benchmarks
    assert {name for name, smallest in benchmarks.items() if not smallest} == set(NOT_RUN) - {"gpu_smoke"}
    assert benchmarks["gpu_smoke"], "its smallest run is stated (its --quick)"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(name for name, smallest in _benchmarks().items() if name not in NOT_RUN))
def test_every_benchmark_runs_at_its_smallest_size(name, tmp_path):
    if name == "gpu" and not torch.cuda.is_available():
        pytest.skip("needs CUDA")  # a GPU test: the skip guard allows it
    if name == "spark":
        needs_spark()
    if name in NEEDS_CGROUPS and (os.geteuid() != 0 or not Path("/sys/fs/cgroup/memory").is_dir()):
        pytest.skip(
            "needs root and cgroup v1's memory controller"
        )  # CI has both: it never skips there  # skips without the spark extra or Java, as every Spark test does
    result = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{name}", "--smallest"],
        cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "|" in result.stdout, "it printed its table"


@pytest.mark.slow
def test_the_gpu_smoke_test_dry_runs_on_the_cpu_with_every_cuda_check_skipped():
    """Without CUDA each check of the GPU smoke test runs its code on the CPU and says SKIP (with what it measured
    there): none may fail, so the script is ready for the first GPU. A hang fails here after the timeout, with the
    checks that had finished (it takes 20-40 s on 2 cores; it hung in 2 of about 20 suite runs before the NCCL check
    kept its DDP to the end, and ran 40 times clean two at a time after)."""
    from benchmarks.gpu_smoke import CHECKS

    if torch.cuda.is_available():
        pytest.skip("a GPU machine runs the smoke test itself (docs/gpus.md)")  # the skip guard allows it
    # Only what docs/gpus.md's install line names (with torch, numpy and what a new environment holds) is visible to
    # its imports: the line is what a bare GPU machine needs.
    # TorchRec's check runs where its extra is installed (CI), as on a GPU machine that has it.
    torchrec = ["torchrec", "fbgemm-gpu-cpu"] if importlib.util.find_spec("torchrec") else []
    installed = ",".join(["torch", "numpy", "pip", "setuptools", *smoke_test_packages(), *torchrec])
    try:
        result = subprocess.run(
            [sys.executable, "tests/installed_only.py", installed, "benchmarks.gpu_smoke", "--smallest"],
            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(["src", "."])},
        )  # fmt: skip
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"hung after these checks:\n{hung.stdout}\n{(hung.stderr or '')[-2000:]}")
    rows = [line.split(" | ") for line in result.stdout.splitlines() if line.startswith("| ") and " | SKIP | " in line]
    assert [row[0].removeprefix("| ") for row in rows] == list(CHECKS), result.stdout + result.stderr[-3000:]
    ran = [row for row in rows if "no CUDA (ran on the CPU: " in row[2]]
    not_installed = [row[0].removeprefix("| ") for row in rows if "is not installed here" in row[2]]
    assert len(ran) == len(rows) - len(not_installed), result.stdout
    assert not_installed == ([] if torchrec else ["TorchRec on the device"]), result.stdout
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]


def smoke_test_packages() -> list[str]:
    """The packages docs/gpus.md's install line for the smoke test names (in the code block that runs it)."""
    text = (PROJECT_ROOT / "docs" / "gpus.md").read_text()
    [block] = [b for b in text.split("```")[1::2] if "benchmarks.gpu_smoke" in b]
    [line] = [line for line in block.splitlines() if line.startswith("python -m pip install ")]
    return line.removeprefix("python -m pip install ").split()


def test_the_smoke_test_s_install_line_leaves_out_what_the_smoke_test_does_not_need():
    """Each package of the line is needed: without it the smoke test does not start (so the line stays short)."""
    packages = smoke_test_packages()
    assert "loguru" in packages and "torch" not in packages
    for left_out in packages:
        installed = ",".join(["torch", "numpy", "pip", "setuptools", *(p for p in packages if p != left_out)])
        result = subprocess.run(
            [sys.executable, "tests/installed_only.py", installed, "benchmarks.gpu_smoke", "--help"],
            cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(["src", "."])},
        )  # fmt: skip
        assert result.returncode != 0 and f"No module named '{left_out}'" in result.stderr, left_out


def test_every_quality_study_setting_builds_its_model_through_the_yaml_names(tmp_path):
    """The quality studies train too long to run here: each of their settings is built instead, through the YAML's
    names (an unknown or misspelt name, or sizes the defaults refuse, fail here, not minutes into a study)."""
    from benchmarks import training
    from benchmarks.quality import common as quality
    from benchmarks.quality.remedies import REMEDIES

    studies = [quality.CURVE_SETTINGS, *quality.REAL_DLRM_GRID]
    studies += [{**quality.CURVE_SETTINGS, "training.interaction": i} for i in quality.INTERACTIONS]
    studies += [{**quality.CURVE_SETTINGS, **change} for change in REMEDIES.values()]
    for options in studies:
        assert {key.split(".")[0] for key in options} <= {"training", "metadata", "initial_ctr", "shared_missing_row"}
        config = quality.training_config(options, tmp_path)
        assert config.model_config([3] * 26).table_sizes == [3] * 26
        quality.metadata_config(options)
    assert quality.training_config({"training.batch_size.train": 8192}, tmp_path).batch_size.train == 8192
    assert quality.metadata_config({"metadata.min_frequency": 7}).min_frequency == 7
    for spec in [training.KAGGLE_LIKE, *training.CONFIGURATIONS.values()]:
        training.spec_config(spec)


def test_the_harness_runs_a_benchmark_at_its_smallest_sizes_and_prints_whole_table_rows(capsys):
    from benchmarks.harness import Arguments, Table

    parser = Arguments("doc", ["--rows", "10"])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=40)
    assert (parser.parse_args([]).rows, parser.parse_args(["--smallest"]).rows) == (1_000_000, 10)
    assert parser.parse_args(["--smallest", "--steps", "3"]).steps == 3, "what is given still counts"
    table = Table("check", "figure", "seconds", align="llr")
    table.row("max |difference|", 0.5, "1.0")
    with pytest.raises(ValueError, match="2 cells in a table of 3 columns"):
        table.row("short", 1)
    assert capsys.readouterr().out.splitlines() == [
        "| check | figure | seconds |",
        "| --- | --- | ---: |",
        r"| max \|difference\| | 0.5 | 1.0 |",
    ]


def test_a_smallest_run_measures_the_machine_on_small_products(monkeypatch, capsys):
    """Every benchmark's smallest run (the suite runs 18) took 145 s on an AVX2 CPU, 140 of them two 2048^3 bf16
    products for the header's rates (0.235 GFLOP/s): a run that only proves the benchmark works measures on 256^3."""
    from benchmarks import harness

    monkeypatch.setattr(harness, "_SMALLEST", False)
    harness.Arguments("a benchmark", smallest=[]).parse_args(["--smallest"])
    fp32, bf16 = harness.describe_machine()
    assert fp32 > 0 and bf16 > 0
    assert "matmul 256x256 (--smallest: small products, not figures to compare)" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["day_0.gz", "day_0"])
def test_the_ingestion_benchmark_s_day_from_a_sample_repeats_its_lines_in_order(name, tmp_path):
    """``--sample``: a day of real rows (their empty cells and categories, which generated rows only imitate)."""
    import gzip

    from benchmarks.ingestion import write_sampled_day

    lines = [b"1\t5\t\t" + b"\t" * 36 + b"68fd1e64\n", b"0\t\t-1\t" + b"\t" * 36 + b"\n", b"0\t7\t3\t" + b"\t" * 37]
    sample = tmp_path / "sample.tsv"
    sample.write_bytes(b"".join(lines))  # its last line without a newline, as a file cut by `head -c` may end
    write_sampled_day(tmp_path / name, 8, sample)
    text = (gzip.open if name.endswith(".gz") else open)(tmp_path / name, "rb").read()
    whole = [*lines[:2], lines[2] + b"\n"]
    assert text == b"".join((whole * 3)[:8])

    (tmp_path / "empty.tsv").write_bytes(b"")
    with pytest.raises(SystemExit, match="empty.tsv: no rows to repeat"):
        write_sampled_day(tmp_path / name, 8, tmp_path / "empty.tsv")


def test_the_spark_benchmark_compares_every_output_and_never_nothing(tmp_path):
    """Each measurement removed both engines' earlier outputs, so the Parquet days were gone by the comparison, which
    then compared none and said both engines wrote the same days."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from benchmarks.spark import _same_outputs

    for engine in ("local", "spark"):
        (tmp_path / f"metadata_{engine}.json").write_text("{}")
        (tmp_path / f"encoded_{engine}").mkdir()
        (tmp_path / f"encoded_{engine}" / "part_0.bin").write_bytes(b"same")
    assert _same_outputs(tmp_path) == ["Parquet: none written by the local engine"]
    for engine, values in (("local", [1, 2]), ("spark", [1, 3])):
        (tmp_path / f"parquet_{engine}").mkdir()
        pq.write_table(pa.table({"label": values}), tmp_path / f"parquet_{engine}" / "day_0.parquet")
    assert _same_outputs(tmp_path) == ["Parquet day_0.parquet"]
