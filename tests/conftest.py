"""Shared fixtures: seeded synthetic Criteo data and throwaway copies of the Kedro project."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sysconfig
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

pytest_plugins = ["tests.skip_guard", "tests.tiers", "tests.project_guard"]

# Every test starts from the project's defaults, whatever the caller's shell holds: this project's settings
# (tracking off, progress lines), Kedro's (another configuration environment, another logging file) and MLflow's
# (another tracking server) and PySpark's (another Python for Spark's workers). Kept: CI's skip guard and what the
# tests themselves hand their processes.
USER_SETTINGS = ("CRITEO_DLRM_", "KEDRO_ENV", "KEDRO_LOGGING_CONFIG", "MLFLOW_", "PYSPARK_")
KEPT = ("CRITEO_DLRM_FAIL_ON_SKIP", "CRITEO_DLRM_TEST_")
for _name in [n for n in os.environ if n.startswith(USER_SETTINGS) and not n.startswith(KEPT)]:
    del os.environ[_name]
os.environ.setdefault("KEDRO_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TQDM_DISABLE", "1")
# The environment's own commands first on the PATH, as activating it puts them: the tests run the user's command
# lines (`kedro run ...`, `kedro viz`), also where pytest was started as `.venv/bin/pytest` without activating.
ENVIRONMENT_SCRIPTS = sysconfig.get_path("scripts")
if os.environ.get("PATH", "").split(os.pathsep)[0] != ENVIRONMENT_SCRIPTS:
    os.environ["PATH"] = os.pathsep.join([ENVIRONMENT_SCRIPTS, *filter(None, [os.environ.get("PATH")])])

PROJECT_ROOT = Path(__file__).resolve().parents[1]
REAL_DATA = PROJECT_ROOT.parent / "shared" / "data" / "criteo_real"
# Rows scored in other batches (another slice of the day, another row count per forward pass) agree within
# float32 rounding, not bit for bit: which matrix kernel runs, and so the order of its sums, depends on the batch
# shape and on the CPU (AVX2, AVX-512, AMX). Bit-identity is claimed, and tested, only for the same batches.
FLOAT32_ROUNDING = {"rtol": 1e-5, "atol": 1e-7}


def naive_parse_line(line: str) -> tuple:
    """An independent reference: Python's own int() on each field of one raw line."""
    fields = line.rstrip("\r\n").split("\t")
    assert len(fields) == 40
    label = int(fields[0])
    dense = [int(value) if value else None for value in fields[1:14]]
    sparse = [int(value, 16) if value else None for value in fields[14:]]
    return (label, *dense, *sparse)


@pytest.fixture
def real_data() -> Path:
    if not REAL_DATA.is_dir():
        pytest.skip(f"real Criteo sample not present at {REAL_DATA}")
    return REAL_DATA


def copy_project(destination: Path, raw_source: Path | None = None) -> Path:
    """A copy of the project's configuration and raw data in ``destination`` (the package stays installed)."""
    destination.mkdir(parents=True, exist_ok=True)
    for name in ("pyproject.toml", ".telemetry"):
        shutil.copy(PROJECT_ROOT / name, destination / name)
    shutil.copytree(PROJECT_ROOT / "conf", destination / "conf", ignore=shutil.ignore_patterns("credentials.yml"))
    (destination / "src").mkdir()  # Kedro wants it; the package itself is installed
    raw = destination / "data" / "01_raw"
    shutil.copytree(raw_source or PROJECT_ROOT / "data" / "01_raw", raw, ignore=shutil.ignore_patterns(".gitkeep"))
    return destination


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temporary copy of the project, as the working directory, so runs never write into the repository."""
    path = copy_project(tmp_path / "project")
    monkeypatch.chdir(path)
    return path


# The tests' small model, in parameters_training.yml's names (``TrainingConfig.from_dict(TINY_MODEL)``): the one
# copy every test that trains a model starts from.
TINY_MODEL = {
    "dense_mlp": {"hidden_layer_sizes": [16], "output_size": 8},
    "sparse_embedding_sizes": 8,
    "prediction_hidden_sizes": [16],
}


def stored_checkpoint(**stored):
    """A checkpoint record read from the stored entries ``stored`` (any weights: a file's integrity is what such a
    test checks), its other required entries a tiny model's; entries it does not know kept in ``others``."""
    from criteo_dlrm.engine.trained.checkpoint import Checkpoint

    required = {"step": 1, "model_config": tiny_model_config([4] * 26).to_dict(), "metadata": {}, "encoder": {}}
    return Checkpoint.from_dict({**required, **stored})


def tiny_model_config(table_sizes: list[int], initial_ctr: float | None = None, **training):
    """``TINY_MODEL``'s ``DLRMConfig`` for ``table_sizes``, with ``training`` (parameters_training.yml's names;
    a nested section given whole, e.g. ``dense_mlp={...}``) replacing its values: built the way training builds
    one, so the model's defaults have one home."""
    from criteo_dlrm.config.training import TrainingConfig

    return TrainingConfig.from_dict({**TINY_MODEL, **training}).model_config(table_sizes, initial_ctr)


def ingestion_report(tmp_path: Path, days: int = 3):
    """The ingestion report (``IngestionReport``) of ``days`` generated days of 2,000 rows, converted to Parquet in
    ``tmp_path``."""
    from criteo_dlrm.data.lineage import day_lineage
    from criteo_dlrm.data.raw import convert_day
    from criteo_dlrm.data.source_days import IngestedDay, IngestionReport
    from criteo_dlrm.data.synthetic import ClickModel, write_day

    model, entries = ClickModel(seed=1), []
    for day in range(days):
        write_day(tmp_path / f"day_{day}", 2000, day=day, model=model)
        report = convert_day(tmp_path / f"day_{day}", tmp_path / f"day_{day}.parquet")
        lineage = day_lineage(f"day_{day}", report.parquet)
        entries.append(IngestedDay(**vars(lineage), rejected=report.rejected, seconds=report.seconds))
    return IngestionReport(raw_dir=str(tmp_path), parquet_dir=str(tmp_path), days=entries)


def tiny_trainer(features: dict, config, run_dir: Path, *, train=None, shuffle: bool = True, device=None,
                 model_config=None, **trainer_options):  # fmt: skip
    """A ``Trainer`` wired as a training process wires one (``engine.training.process``): ``config``'s parallel mode
    with its model built from ``config.seed`` (``model_config``, or ``config``'s sizes for the features' tables, the
    output at their click rate), the training rows (``train``, or the features') in batches of ``batch_size.train``, the
    validation rows in batches of ``batch_size.validation``."""
    import torch

    from criteo_dlrm.data.batches import BatchLoader
    from criteo_dlrm.engine.parallel.modes import build_mode
    from criteo_dlrm.engine.training.loop import Trainer

    device = device or torch.device("cpu")
    metadata = features["metadata"]
    if model_config is None:
        model_config = config.model_config(metadata.table_sizes, metadata.click_rate)
    torch.manual_seed(config.seed)
    pin = device.type == "cuda"
    return Trainer(
        build_mode(model_config, config, device),
        config,
        BatchLoader(
            features["train"] if train is None else train,
            config.batch_size.train,
            shuffle=shuffle,
            seed=config.seed,
            pin_memory=pin,
        ),  # fmt: skip
        BatchLoader(features["validation"], config.batch_size.validation, pin_memory=pin),
        run_dir,
        **trainer_options,
    )


@pytest.fixture(scope="session")
def tiny_features(tmp_path_factory):
    """Encoded training and validation rows (3,000 + 1,000) from the planted click model, plus their metadata."""
    from criteo_dlrm.config.metadata import MetadataConfig
    from criteo_dlrm.data.encoding import FeatureEncoder
    from criteo_dlrm.data.feature_metadata import FeatureVocabularies
    from criteo_dlrm.data.lineage import day_lineage, encoded_lineage
    from criteo_dlrm.data.metadata import compute_feature_metadata
    from criteo_dlrm.data.raw import convert_day
    from criteo_dlrm.data.source_days import SourceDays
    from criteo_dlrm.data.synthetic import ClickModel, write_day

    folder = tmp_path_factory.mktemp("tiny")
    model, parquet = ClickModel(seed=11), []
    for day, rows in enumerate((3000, 1000)):
        write_day(folder / f"day_{day}", rows, day=day, model=model)
        parquet.append(convert_day(folder / f"day_{day}", folder / f"day_{day}.parquet").parquet)
    metadata, vocabularies = compute_feature_metadata(
        parquet[:1], MetadataConfig(min_expected_clicks=0, min_frequency=2), progress=False
    )
    source_days = SourceDays(
        train=[day_lineage("day_0", parquet[0])],
        validation=[
            dataclasses.replace(
                day_lineage("day_1", parquet[1]), click_probability=str(folder / "day_1.click_probability.npy")
            )
        ],
    )
    version = "2026-01-01T00.00.00.000Z"
    typed = dataclasses.replace(metadata, source_days=source_days)
    encoder = FeatureEncoder.from_metadata(typed, vocabularies)
    train, validation = encoder.encode_days(parquet[:1]), encoder.encode_days(parquet[1:])
    train.lineage = encoded_lineage(typed, version, typed.source_days.train)
    validation.lineage = encoded_lineage(typed, version, typed.source_days.validation)
    return {
        "metadata": typed,  # the record, as the catalog loads it
        "vocabularies": FeatureVocabularies(vocabularies, version=version),
        "train": train,
        "validation": validation,
    }


def session_folder(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """This test session's folder: above each pytest-xdist worker's own, or, without xdist, the session's own."""
    return tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent


def made_once(tmp_path_factory: pytest.TempPathFactory, worker_id: str, name: str, make) -> Path:
    """``make(folder)``'s folder, made once for the whole session: the first test process (pytest-xdist's worker)
    to need it makes it, under a lock the others wait on, in the session's folder above each worker's own."""
    from filelock import FileLock

    shared = session_folder(tmp_path_factory, worker_id)
    folder = shared / name
    with FileLock(shared / f"{name}.lock"):
        if not (shared / f"{name}.finished").exists():
            shutil.rmtree(folder, ignore_errors=True)  # a worker that failed while making it
            make(folder)
            (shared / f"{name}.finished").touch()
    return folder


def _run_the_job(folder: Path) -> None:
    """A project copy in ``folder`` after one `kedro run` (one epoch, tracked)."""
    from kedro.framework.session import KedroSession
    from kedro.framework.startup import bootstrap_project

    copy_project(folder)
    previous = Path.cwd()
    os.chdir(folder)
    try:
        bootstrap_project(folder)
        with KedroSession.create(project_path=folder, runtime_params={"training": {"num_epochs": 1}}) as session:
            session.run()
    finally:
        os.chdir(previous)


@pytest.fixture(scope="session")
def ran_project(tmp_path_factory, worker_id) -> Path:
    """A project copy after one `kedro run` (one epoch), shared by the tests that only read its outputs: the run is
    made once a session (each test process made its own, 30-50 s on 2 cores), and each test process reads its own
    copy (kedro-viz, the MLflow UI and the notebook write their files in it). The copy's MLflow records name the
    artifacts where the run wrote them, in the session's folder."""
    made = made_once(tmp_path_factory, worker_id, "ran_project", _run_the_job)
    return Path(shutil.copytree(made, tmp_path_factory.mktemp("ran") / "project", symlinks=True))


@pytest.fixture
def nccl_like_processes(monkeypatch):
    """Processes started in the test (and those they start) refuse host tensors in this package's collectives and
    take its NCCL branches, as a GPU run over NCCL would (tests/nccl_like.py)."""
    from tests.nccl_like import nccl_like_environment

    for name, value in nccl_like_environment().items():
        if os.environ.get(name) != value:
            monkeypatch.setenv(name, value)


@pytest.fixture
def logged():
    """The messages loguru logs during the test, one string each."""
    from loguru import logger

    lines: list[str] = []
    sink = logger.add(lines.append, format="{message}")
    yield lines
    logger.remove(sink)


# Ports tests choose themselves: 1,000 for each test process (pytest-xdist's gw0, gw1, ...), below the kernel's
# ephemeral range (32768 and up here). A port found free and released again could otherwise be given by the
# kernel to another test's port-0 bind a moment later (an elastic launcher's c10d store, say): a two-node test
# then joined that store and failed when its test ended. Ports from this range are never handed out that way,
# and the test processes' ranges do not overlap. Two suites at once (two checkouts, two CI jobs on one machine) have
# a gw1 each: a port is claimed machine-wide with a lock file, held until the test process ends, so the other
# suite's gw1 takes the next one (both took the same ports in the same order, and a two-node test joined the other
# suite's rendezvous store).
_PORT_BASE, _PORTS_PER_PROCESS = 20_000, 1_000
_ports = itertools.count()
_PORT_CLAIMS = Path(tempfile.gettempdir()) / "criteo_dlrm_test_ports"
_claimed: list = []  # the lock files of the ports this process handed out, open (locked) until it ends


def _claim(port: int) -> bool:
    """Lock ``port`` for this process, machine-wide; False when another test process holds it."""
    _PORT_CLAIMS.mkdir(exist_ok=True)
    handle = open(_PORT_CLAIMS / f"{port}.lock", "w")  # noqa: SIM115 - held open: the lock lives as long as it
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return False
    _claimed.append(handle)
    return True


def unused_port() -> int:
    """A loopback port nothing listens on, from this test process's own range, claimed for it machine-wide (a new one
    each call)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    base = _PORT_BASE + _PORTS_PER_PROCESS * (int(worker) if worker.isdigit() else 0)
    assert base + _PORTS_PER_PROCESS <= _ephemeral_start(), "the test ports reach the kernel's ephemeral range"
    for _ in range(_PORTS_PER_PROCESS):
        port = base + next(_ports) % _PORTS_PER_PROCESS
        if not _claim(port):
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {base}-{base + _PORTS_PER_PROCESS - 1}")


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32_768  # Linux's default where the setting cannot be read


def headless_dom(url: str, profile: Path, budget_ms: int = 20000, *flags: str) -> str:
    """The DOM Debian's headless Chromium has built for ``url`` after ``budget_ms`` of virtual time."""
    command = [
        "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", *flags,
        f"--user-data-dir={profile}", f"--virtual-time-budget={budget_ms}", "--dump-dom", url,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=120).stdout


@contextlib.contextmanager
def served(command: list[str], cwd: Path, log: Path, url, probe: str, what: str, timeout: float = 240):
    """Start a server command in its own process group, wait until ``url() + probe`` answers, yield its URL,
    and stop the whole group (the server and what it started) at the end. ``url``: a function, because a
    server may move to another port and say so in its log."""
    env = {**os.environ, "KEDRO_DISABLE_TELEMETRY": "1"}
    with log.open("w") as handle:
        process = subprocess.Popen(command, cwd=cwd, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + timeout
        while True:
            base = url()
            try:
                with urllib.request.urlopen(f"{base}{probe}", timeout=2):  # noqa: S310 - loopback only
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"{what} did not start:\n{log.read_text()[-3000:]}")
                time.sleep(1)
        yield base
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)


@pytest.fixture(scope="session")
def tiny_checkpoint(tiny_features, tmp_path_factory):
    """A checkpoint of one epoch on ``tiny_features`` (through the training node), with a catalog version."""
    from criteo_dlrm.pipelines.training.nodes import train_dlrm
    from tests.pipelines.training.test_pipeline import training_params

    params = training_params(tmp_path_factory.mktemp("train"), num_epochs=1)
    checkpoint, _ = train_dlrm(
        tiny_features["train"],
        tiny_features["validation"],
        tiny_features["metadata"],
        tiny_features["vocabularies"],
        params,
        "v",
    )
    return dataclasses.replace(checkpoint, version="2026-11-30T01.00.00.000Z")


def with_altered_vocabulary(checkpoint, feature: int):
    """A copy of ``checkpoint`` whose encoder holds feature ``feature``'s vocabulary reversed (the checkpoint
    itself untouched): what every reader of a checkpoint must refuse."""
    import torch

    vocabularies = list(checkpoint.encoder_state["vocabularies"])
    vocabularies[feature] = torch.flip(vocabularies[feature], dims=[0])
    return dataclasses.replace(checkpoint, encoder_state={**checkpoint.encoder_state, "vocabularies": vocabularies})


@pytest.fixture(scope="session")
def converted_day(tmp_path_factory) -> tuple[Path, Path, list]:
    """A generated day of 3,000 rows, converted: its raw file, its Parquet day and its rows (the fault-injection
    tests damage copies of them)."""
    import pyarrow.parquet as pq

    from criteo_dlrm.data.raw import convert_day
    from criteo_dlrm.data.synthetic import ClickModel, write_day

    folder = tmp_path_factory.mktemp("day")
    write_day(folder / "day_0", 3000, day=0, model=ClickModel(seed=4))
    parquet = Path(convert_day(folder / "day_0", folder / "out" / "day_0.parquet").parquet)
    return folder / "day_0", parquet, pq.read_table(parquet).to_pylist()
