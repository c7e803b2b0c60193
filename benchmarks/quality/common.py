"""What the model-quality studies share: the planted click model's days and the real Criteo rows, the settings
(``kedro run --params`` names) over the project's defaults, training our DLRM through the recipe and the hashed
logistic regression, and the studies' common arguments.

Each study is a module of this package, run from the project's root: ``python -m benchmarks.quality.<study>``
(``curve``, ``remedies``, ``reference``, ``min_frequency``, ``small_data``, ``loaders``, ``precision``).
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from benchmarks.baselines import hash_features, train_logistic_regression
from benchmarks.harness import Arguments
from criteo_dlrm.common.schema import SPARSE_COLUMNS
from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.data.parquet import sparse_values
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.stored import EncodedArrays
from criteo_dlrm.data.synthetic import ClickModel, read_probabilities, write_day
from criteo_dlrm.engine.trained.metrics import binary_metrics
from criteo_dlrm.engine.training.recipe import run_training

DAY_ROWS = 100_000
WORLD_SEED = 0  # the planted click model's
WORLD_CTR = {"ctr": 0.25}  # the planted click model's base rate (--ctr)
REAL_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "criteo_real"


def hashed(paths: list[Path], encoded: EncodedArrays) -> EncodedArrays:
    raw = np.concatenate(
        [np.stack([sparse_values(pq.read_table(p).column(n)) for n in SPARSE_COLUMNS], axis=1) for p in paths]
    )
    return EncodedArrays(encoded.labels, encoded.dense, hash_features(raw))


def embedding_size(size: int) -> dict:
    """Embeddings of ``size`` and the dense MLP's output of the same size (the dot interactions need both)."""
    return {"training.sparse_embedding_sizes": size, "training.dense_mlp.output_size": size}


def section(options: dict, name: str) -> dict:
    """The options under ``name`` (``--params`` names, ``training.batch_size.train``) as that section's nested
    dict (``{"batch_size": {"train": ...}}``), as ``TrainingConfig.from_dict`` and ``MetadataConfig.from_dict``
    read ``params:training`` and ``params:metadata``."""
    nested: dict = {}
    for key, value in options.items():
        first, *path = key.split(".")
        if first == name:
            inner = nested
            for part in path[:-1]:
                inner = inner.setdefault(part, {})
            inner[path[-1]] = value
    return nested


# Every study's settings are ``kedro run --params`` names (``training.learning_rate``, ``metadata.min_frequency``),
# plus two of the studies' own: ``initial_ctr`` and ``shared_missing_row`` (former layouts, see ``encode``).
# The DLRM settings of the learning curve: the project's defaults (conf/base) for everything not named here.
CURVE_SETTINGS = {
    "metadata.min_frequency": 3,
    "metadata.min_expected_clicks": 3,
    **embedding_size(TrainingConfig().sparse_embedding_sizes),
}
INTERACTIONS = ("dot_cat", "dcn")  # the default and DCN-v2
# Ten thousand training rows need other settings. Both models get four candidates, picked by validation
# log loss, so neither is tuned more than the other.
REAL_DLRM_GRID = [
    {
        "metadata.min_frequency": frequency,
        **embedding_size(dim),
        "training.batch_size.train": 128,
        "training.embedding_optimizer": "adagrad",
        "training.embedding_learning_rate": 0.015,
    }
    for frequency in (20, 40)
    for dim in (4, 8)
]
REAL_LOGISTIC_GRID = [{"lr": lr} for lr in (0.01, 0.02, 0.05, 0.1)]


def metadata_config(options: dict) -> MetadataConfig:
    return MetadataConfig.from_dict({"min_expected_clicks": 0, **section(options, "metadata")})


def training_config(options: dict, run_dir: Path) -> TrainingConfig:
    """The options' ``training`` settings over the project's defaults, on the CPU, logging to ``run_dir``."""
    settings = {
        "device": "cpu",
        "dense_mlp": {"hidden_layer_sizes": [64]},
        "batch_size": {"validation": 16384},
        "log_every_steps": 1000,
        "resume": False,
        "tensorboard_dir": str(run_dir),
        "in_progress_dir": str(run_dir / "in_progress"),  # not the working directory's data/
    }
    for key, value in section(options, "training").items():
        settings[key] = {**settings[key], **value} if isinstance(value, dict) and key in settings else value
    return TrainingConfig.from_dict(settings)


def encode(train_paths: list[Path], validation_paths: list[Path], options: dict) -> tuple:
    """``(metadata, vocabularies, train, validation)``: the metadata pass over the training days with the
    options' ``metadata`` settings (``min_expected_clicks`` 0 unless given), and both sides encoded with it.
    ``shared_missing_row``: the layout before missing values had a row of their own (missing and unseen share
    row 0)."""
    metadata, vocabularies = compute_feature_metadata(train_paths, metadata_config(options), progress=False)
    if options.get("shared_missing_row"):
        sparse = {n: {**st, "table_size": st["table_size"] - 1} for n, st in metadata.sparse.items()}
        metadata = dataclasses.replace(metadata, format=1, sparse=sparse)
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    return metadata, vocabularies, encoder.encode_days(train_paths), encoder.encode_days(validation_paths)


def train_dlrm(train_paths: list[Path], validation_paths: list[Path], options: dict, run_dir: Path) -> dict:
    return fit_dlrm(encode(train_paths, validation_paths, options), options, run_dir)


def fit_dlrm(encoded: tuple, options: dict, run_dir: Path) -> dict:
    """Train the DLRM on ``encode``'s output with the options (the project's defaults for the rest)."""
    metadata, vocabularies, train, validation = encoded
    config = training_config(options, run_dir)
    if "initial_ctr" in options:  # the output's starting click rate (0.5: the bias at 0, as before the prior)
        metadata = dataclasses.replace(metadata, click_rate=options["initial_ctr"])
    checkpoint, summary = run_training(config, train, validation, metadata, vocabularies, "quality")
    history = summary.history
    best_record = next(h for h in history if h.step == checkpoint.step)
    # The first epoch's training time, when it ran to its end (the last validation of epoch 0 is at its end).
    finished_first = any(h.epoch > 0 for h in history)
    return {
        **checkpoint.best_validation.to_dict(),
        "epoch": checkpoint.epoch,
        "step": checkpoint.step,
        "seconds_to_best": best_record.train_seconds,
        "seconds_first_epoch": [h for h in history if h.epoch == 0][-1].train_seconds if finished_first else None,
        "seconds_total": history[-1].train_seconds,
        "settings": options,
    }


def train_logistic(train_paths: list[Path], validation_paths: list[Path], options: dict) -> dict:
    # Dense inputs standardised like the DLRM's; categories hashed from their raw values.
    metadata, _ = compute_feature_metadata(
        train_paths, MetadataConfig(min_frequency=1, min_expected_clicks=0, use_modulus_hash=True), progress=False
    )
    encoder = FeatureEncoder.from_metadata(metadata, None)
    train, validation = encoder.encode_days(train_paths), encoder.encode_days(validation_paths)
    return {
        **train_logistic_regression(hashed(train_paths, train), hashed(validation_paths, validation), **options),
        "settings": options,
    }


def generated_days(work: Path, days: int, validation_rows: int) -> tuple[list[Path], dict]:
    """``days`` training days of ``DAY_ROWS`` rows and one validation day of ``validation_rows`` from the
    planted click model, as Parquet; and the oracle's metrics on the validation day (the true probabilities)."""
    model, paths = ClickModel(WORLD_SEED, **WORLD_CTR), []
    for day in range(days + 1):
        write_day(work / f"day_{day}", validation_rows if day == days else DAY_ROWS, day=day, model=model)
        paths.append(Path(convert_day(work / f"day_{day}", work / f"day_{day}.parquet", progress=False).parquet))
    oracle = binary_metrics(
        pq.read_table(paths[-1]).column("labels").to_numpy(), read_probabilities(work / f"day_{days}")
    )
    return paths, oracle.to_dict()  # a row of the benchmark's tables


def real_days(work: Path) -> tuple[list[Path], list[Path]]:
    """The real Criteo rows as Parquet: the Kaggle first 10k to train, the Kaggle random 4,584 to validate."""
    train = convert_day(REAL_DATA / "kaggle_dac_train_first10k.tsv", work / "real_train.parquet", progress=False)
    validation = convert_day(
        REAL_DATA / "kaggle_dac_train_random4584.tsv", work / "real_validation.parquet", progress=False
    )
    return [Path(train.parquet)], [Path(validation.parquet)]


def best(results: list[dict]) -> dict:
    return min(results, key=lambda r: r["log_loss"])


def real_rows(work: Path) -> tuple[dict, dict] | None:
    if not REAL_DATA.is_dir():
        return None
    train_paths, validation_paths = real_days(work)
    dlrm = best([train_dlrm(train_paths, validation_paths, options, work / "runs") for options in REAL_DLRM_GRID])
    logistic = best([train_logistic(train_paths, validation_paths, options) for options in REAL_LOGISTIC_GRID])
    return dlrm, logistic


def world_days(work: Path, world: str, days: int, validation_rows: int, ctr_of) -> list[Path]:
    """``days`` training days of ``DAY_ROWS`` and a validation day of ``validation_rows`` from the planted click
    model with base rate ``ctr_of(day)``, converted to Parquet under ``work``, in day order."""
    paths = []
    for day in range(days + 1):
        folder = work / world.replace("%", "").replace(" ", "_") / f"day_{day}"
        folder.parent.mkdir(parents=True, exist_ok=True)
        model = ClickModel(WORLD_SEED, ctr=ctr_of(day))
        write_day(folder, validation_rows if day == days else DAY_ROWS, day=day, model=model)
        paths.append(Path(convert_day(folder, folder.with_suffix(".parquet"), progress=False).parquet))
    return paths


def study_arguments(doc: str | None) -> Arguments:
    """A study's command line with the arguments every study takes: ``--validation-rows`` and ``--ctr`` (the
    planted click model's base rate: Criteo 1TB's is about 3%, the Kaggle release's 25%). A study trains to
    convergence (minutes to hours on 2 cores): the tests build its settings instead of running it."""
    parser = Arguments(doc, None)
    parser.add_argument("--validation-rows", type=int, default=200_000)
    parser.add_argument("--ctr", type=float, default=0.25, help="the planted click model's base rate")
    return parser


def in_a_work_folder(args, study) -> None:
    """Run ``study(work)`` in a temporary folder, with the planted click model at ``args.ctr``."""
    WORLD_CTR["ctr"] = args.ctr
    with tempfile.TemporaryDirectory() as tmp:
        study(Path(tmp))
