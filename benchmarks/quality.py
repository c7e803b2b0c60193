"""Model quality: a learning curve of our DLRM against a hashed logistic regression and the oracle.

On generated data (the planted click model, so the best achievable AUC and log loss are known), for
several training sizes; and on the real Criteo rows in ../shared/data/criteo_real (train on the Kaggle
first 10k, validate on the Kaggle random 4,584) when that folder exists.

    python benchmarks/quality.py [--sizes 100000 300000 1000000 3000000] [--plot benchmarks/results/learning_curve.png]
    python benchmarks/quality.py --remedies 1000000                                 # known remedies at one size
    python benchmarks/quality.py --reference 2000000       # against the planted model's own form, learned
    python benchmarks/quality.py --min-frequencies 3 10 20 40 80 --sizes 100000 1000000   # small-data settings
    python benchmarks/quality.py --ctr 0.03 --sizes 100000 300000 1000000 3000000         # a low click rate
    python benchmarks/quality.py --small-data 3 10 40 100 400 --ctr 0.03    # the small-data rule at low CTR
    python benchmarks/quality.py --loaders 1000000 --seeds 0 1 2     # the chunked shuffle against a full one
    python benchmarks/quality.py --precisions 1000000 --seeds 0 1 2   # bf16 against fp32 at 25% and 3% clicks

``--ctr`` sets the planted click model's base rate (Criteo 1TB's is about 3%, the Kaggle release's 25%).
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from criteo_dlrm.common.schema import SPARSE_COLUMNS
from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.data.parquet import sparse_values
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.stored import EncodedArrays
from criteo_dlrm.data.synthetic import ClickModel, read_probabilities, write_day
from criteo_dlrm.engine.metrics import binary_metrics
from criteo_dlrm.engine.recipe import run_training

from baselines import hash_features, train_logistic_regression, train_planted_form

DAY_ROWS = 100_000
WORLD_SEED = 0  # the planted click model's
WORLD_CTR = {"ctr": 0.25}  # the planted click model's base rate (--ctr)
REAL_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "criteo_real"


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
    history = summary["history"]
    best_record = next(h for h in history if h["step"] == checkpoint["step"])
    # The first epoch's training time, when it ran to its end (the last validation of epoch 0 is at its end).
    finished_first = any(h["epoch"] > 0 for h in history)
    return {
        **checkpoint["best_validation"],
        "epoch": checkpoint["epoch"],
        "step": checkpoint["step"],
        "seconds_to_best": best_record["train_seconds"],
        "seconds_first_epoch": [h for h in history if h["epoch"] == 0][-1]["train_seconds"] if finished_first else None,
        "seconds_total": history[-1]["train_seconds"],
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
    return paths, oracle


def real_days(work: Path) -> tuple[list[Path], list[Path]]:
    """The real Criteo rows as Parquet: the Kaggle first 10k to train, the Kaggle random 4,584 to validate."""
    train = convert_day(REAL_DATA / "kaggle_dac_train_first10k.tsv", work / "real_train.parquet", progress=False)
    validation = convert_day(
        REAL_DATA / "kaggle_dac_train_random4584.tsv", work / "real_validation.parquet", progress=False
    )
    return [Path(train.parquet)], [Path(validation.parquet)]


# Known remedies for the one-epoch overfitting, each against the defaults on the same data (``--remedies``).
REMEDIES = {
    "defaults": {},
    "defaults, seed 1": {"training.seed": 1},
    "defaults, seed 2": {"training.seed": 2},
    "output bias at 0 (probability 0.5) to start, as before": {"initial_ctr": 0.5},
    "missing and unseen values share row 0, as before": {"shared_missing_row": True},
    "min_expected_clicks 1": {"metadata.min_expected_clicks": 1},
    "min_expected_clicks 12": {"metadata.min_expected_clicks": 12},
    "min_expected_clicks 30": {"metadata.min_expected_clicks": 30},
    "min_expected_clicks 30, seed 1": {"metadata.min_expected_clicks": 30, "training.seed": 1},
    "min_expected_clicks 30, seed 2": {"metadata.min_expected_clicks": 30, "training.seed": 2},
    "embedding learning rate 0.001": {"training.embedding_learning_rate": 0.001},
    "embedding learning rate 0.01": {"training.embedding_learning_rate": 0.01},
    "embedding learning rate 0.01, seed 1": {"training.embedding_learning_rate": 0.01, "training.seed": 1},
    "embedding learning rate 0.01, seed 2": {"training.embedding_learning_rate": 0.01, "training.seed": 2},
    "embedding learning rate 0.02": {"training.embedding_learning_rate": 0.02},
    "learning rates 0.003 / 0.01": {"training.learning_rate": 0.003, "training.embedding_learning_rate": 0.01},
    "warm-up 500 steps": {"training.warmup_steps": 500},
    "embedding L2 0.00001": {"training.embedding_weight_decay": 1e-5},
    "embedding L2 0.0001": {"training.embedding_weight_decay": 1e-4},
    "embedding L2 0.001": {"training.embedding_weight_decay": 1e-3},
    "embedding learning rate 0.03": {"training.embedding_learning_rate": 0.03},
    "embedding optimizer adagrad 0.1": {
        "training.embedding_optimizer": "adagrad",
        "training.embedding_learning_rate": 0.1,
    },
    "embedding optimizer adagrad 0.05": {
        "training.embedding_optimizer": "adagrad",
        "training.embedding_learning_rate": 0.05,
    },
    "embedding optimizer adagrad 0.02": {
        "training.embedding_optimizer": "adagrad",
        "training.embedding_learning_rate": 0.02,
    },
    "interaction cat": {"training.interaction": "cat"},
    "dense learning rate 0.0003": {"training.learning_rate": 0.0003},
    "learning rates 0.0003 / 0.001": {"training.learning_rate": 0.0003, "training.embedding_learning_rate": 0.001},
    "dense learning rate 0.003": {"training.learning_rate": 0.003},
    "embedding size 8": {**embedding_size(8)},
    "embedding size 32": {**embedding_size(32)},
    "top MLP 512-256": {"training.prediction_hidden_sizes": [512, 256]},
    "embedding size 32, learning rates 0.003 / 0.01": {
        **embedding_size(32),
        "training.learning_rate": 0.003,
        "training.embedding_learning_rate": 0.01,
    },
    "top MLP dropout 0.1": {"training.prediction_dropout": 0.1},
    "top MLP dropout 0.3": {"training.prediction_dropout": 0.3},
    "1 epoch, cosine decay": {"training.num_epochs": 1, "training.decay": "cosine"},
    "1 epoch, linear decay": {"training.num_epochs": 1, "training.decay": "linear"},
    "batch 2048, learning rates x sqrt(8)": {
        "training.batch_size.train": 2048,
        "training.learning_rate": 0.001 * 8**0.5,
        "training.embedding_learning_rate": 0.003 * 8**0.5,
    },
    "batch 8192, learning rates x sqrt(32)": {
        "training.batch_size.train": 8192,
        "training.learning_rate": 0.001 * 32**0.5,
        "training.embedding_learning_rate": 0.003 * 32**0.5,
    },
    "batch 8192, learning rates x sqrt(32), warm-up 30 steps": {
        "training.batch_size.train": 8192,
        "training.learning_rate": 0.001 * 32**0.5,
        "training.embedding_learning_rate": 0.003 * 32**0.5,
        "training.warmup_steps": 30,
    },
    "batch 2048, dense x sqrt(8), embeddings x 8": {
        "training.batch_size.train": 2048,
        "training.learning_rate": 0.001 * 8**0.5,
        "training.embedding_learning_rate": 0.003 * 8,
    },
    "batch 8192, dense x sqrt(32), embeddings x 32": {
        "training.batch_size.train": 8192,
        "training.learning_rate": 0.001 * 32**0.5,
        "training.embedding_learning_rate": 0.003 * 32,
    },
    "batch 8192, dense x sqrt(32), embeddings x 8": {
        "training.batch_size.train": 8192,
        "training.learning_rate": 0.001 * 32**0.5,
        "training.embedding_learning_rate": 0.003 * 8,
    },
    "batch 8192, dense x 8, embeddings x sqrt(32)": {
        "training.batch_size.train": 8192,
        "training.learning_rate": 0.001 * 8,
        "training.embedding_learning_rate": 0.003 * 32**0.5,
    },
    "batch 8192, dense x sqrt(32), embeddings x 32, 6 validations/epoch, patience 4": {
        "training.batch_size.train": 8192,
        "training.learning_rate": 0.001 * 32**0.5,
        "training.embedding_learning_rate": 0.003 * 32,
        "training.validations_per_epoch": 6,
        "training.early_stopping.patience": 4,
    },
}

# The interaction and embedding size before the defaults became dot_cat at 32, and dot_cat at 16 with the
# levers that had helped most, three seeds each (docs/benchmarks.md, "Low click rates").
SIZE_16_LEVERS = {
    "": {},
    ", min_expected_clicks 30": {"metadata.min_expected_clicks": 30},
    ", embedding learning rate 0.01": {"training.embedding_learning_rate": 0.01},
    ", dense learning rate 0.003": {"training.learning_rate": 0.003},
}
for seed in range(3):
    REMEDIES[f"former defaults (dot, size 16), seed {seed}"] = {
        "training.interaction": "dot",
        **embedding_size(16),
        "training.seed": seed,
    }
    for lever, change in SIZE_16_LEVERS.items():
        REMEDIES[f"dot_cat, size 16{lever}, seed {seed}"] = {
            "training.interaction": "dot_cat",
            **embedding_size(16),
            "training.seed": seed,
            **change,
        }


def remedies(size: int, validation_rows: int, work: Path, names: list[str] | None = None) -> None:
    paths, oracle = generated_days(work, size // DAY_ROWS, validation_rows)
    logistic = train_logistic(paths[:-1], paths[-1:], {})
    print(f"\n{size:,} training rows; LR AUC {logistic['auc']:.4f}, oracle AUC {oracle['auc']:.4f}\n")
    print(
        "| setting | AUC | log loss | calibration | LR-to-oracle gap closed | best at step (epoch) | training s to best "
        "| training s in all |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, change in REMEDIES.items():
        if names and name not in names:
            continue
        d = train_dlrm(
            paths[:-1], paths[-1:], {**CURVE_SETTINGS, "training.validations_per_epoch": 4, **change}, work / "runs"
        )
        closed = (d["auc"] - logistic["auc"]) / (oracle["auc"] - logistic["auc"])
        print(
            f"| {name} | {d['auc']:.4f} | {d['log_loss']:.4f} | {d['calibration']:.3f} | {closed:.0%} | "
            f"{d['step']:,} ({d['epoch']}) | {d['seconds_to_best']:.0f} | {d['seconds_total']:.0f} |",
            flush=True,
        )


# The planted model's own form, learned (``--reference``): the DLRM's table optimiser at three rates, and Adagrad.
PLANTED_FORM_GRID = [("sparse_adam", 0.001), ("sparse_adam", 0.003), ("sparse_adam", 0.01), ("adagrad", 0.05)]


def reference(size: int, validation_rows: int, work: Path) -> None:
    """The DLRM's defaults against a model of the planted click model's own form (which features act alone,
    which pairs interact and at what rank), learned from the same rows and encoded the same way."""
    paths, oracle = generated_days(work, size // DAY_ROWS, validation_rows)
    logistic = train_logistic(paths[:-1], paths[-1:], {})
    print(f"\n{size:,} training rows; LR AUC {logistic['auc']:.4f}, oracle AUC {oracle['auc']:.4f}\n")
    print("| model | AUC | log loss | LR-to-oracle gap closed | best epoch |\n| --- | ---: | ---: | ---: | ---: |")

    def row(name: str, result: dict) -> None:
        closed = (result["auc"] - logistic["auc"]) / (oracle["auc"] - logistic["auc"])
        print(
            f"| {name} | {result['auc']:.4f} | {result['log_loss']:.4f} | {closed:.0%} | {result['epoch']} |",
            flush=True,
        )

    encoded = encode(paths[:-1], paths[-1:], CURVE_SETTINGS)
    row("DLRM, defaults", fit_dlrm(encoded, CURVE_SETTINGS, work / "runs"))
    metadata, _, train, validation = encoded
    table_sizes = metadata.table_sizes
    pairs = ClickModel(WORLD_SEED, **WORLD_CTR).pairs
    for optimizer, lr in PLANTED_FORM_GRID:
        row(f"planted form, {optimizer} {lr}", train_planted_form(train, validation, table_sizes, pairs, optimizer, lr))


def best(results: list[dict]) -> dict:
    return min(results, key=lambda r: r["log_loss"])


def learning_curve(
    sizes: list[int], validation_rows: int, work: Path, interactions: tuple[str, ...], overrides: dict
) -> list[dict]:
    paths, oracle = generated_days(work, -(-max(sizes) // DAY_ROWS), validation_rows)
    validation_path = paths[-1]
    results = []
    for size in sizes:
        started = time.perf_counter()
        train_paths = paths[: size // DAY_ROWS]
        logistic = train_logistic(train_paths, [validation_path], {})
        for interaction in interactions:
            options = {**CURVE_SETTINGS, **overrides, "training.interaction": interaction}
            dlrm = train_dlrm(train_paths, [validation_path], options, work / "runs")
            results.append(
                {
                    "rows": size,
                    "interaction": interaction,
                    "dlrm": dlrm,
                    "logistic": logistic,
                    "oracle": oracle,
                    "seconds": time.perf_counter() - started,
                }
            )
            print(
                f"  {size:>9,} rows, {interaction}: DLRM AUC {dlrm['auc']:.4f} at step {dlrm['step']} "
                f"({dlrm['seconds_to_best']:.0f}s of training), LR AUC {logistic['auc']:.4f}, oracle {oracle['auc']:.4f}",
                flush=True,
            )
    return results


def real_rows(work: Path) -> tuple[dict, dict] | None:
    if not REAL_DATA.is_dir():
        return None
    train_paths, validation_paths = real_days(work)
    dlrm = best([train_dlrm(train_paths, validation_paths, options, work / "runs") for options in REAL_DLRM_GRID])
    logistic = best([train_logistic(train_paths, validation_paths, options) for options in REAL_LOGISTIC_GRID])
    return dlrm, logistic


def small_data(work: Path, frequencies: list[int], sizes: list[int], validation_rows: int) -> None:
    """``metadata.min_frequency`` with the other defaults: on the real rows (3 seeds each, against the logistic
    regression's best of 4) and on generated data of ``sizes`` rows (one seed)."""
    import statistics

    if REAL_DATA.is_dir():
        train, validation = real_days(work)
        logistic = best([train_logistic(train, validation, options) for options in REAL_LOGISTIC_GRID])
        print(f"\nreal rows (Kaggle first 10k -> random 4,584); LR AUC {logistic['auc']:.4f}, "
              f"log loss {logistic['log_loss']:.4f}; DLRM with the defaults but min_frequency, seeds 0-2\n")  # fmt: skip
        print(
            "| min_frequency | AUC (mean +- sd) | log loss (mean +- sd) | log loss - LR's |\n| ---: | ---: | ---: | ---: |"
        )
        for frequency in frequencies:
            runs = [
                train_dlrm(
                    train,
                    validation,
                    {
                        **CURVE_SETTINGS,
                        "metadata.min_frequency": frequency,
                        "metadata.min_expected_clicks": 0,
                        "training.seed": seed,
                    },
                    work / "r",
                )
                for seed in range(3)
            ]
            auc, loss = [r["auc"] for r in runs], [r["log_loss"] for r in runs]
            print(
                f"| {frequency} | {statistics.mean(auc):.4f} +- {statistics.stdev(auc):.4f} | "
                f"{statistics.mean(loss):.4f} +- {statistics.stdev(loss):.4f} | "
                f"{statistics.mean(loss) - logistic['log_loss']:+.4f} |",
                flush=True,
            )
    paths, _ = generated_days(work, max(sizes) // DAY_ROWS, validation_rows)
    print("\ngenerated data, DLRM with the defaults but min_frequency\n")
    print(
        "| training rows | min_frequency | AUC | log loss | LR AUC | LR log loss |\n| ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    for size in sizes:
        logistic = train_logistic(paths[: size // DAY_ROWS], paths[-1:], {})
        for frequency in frequencies:
            options = {**CURVE_SETTINGS, "metadata.min_frequency": frequency, "metadata.min_expected_clicks": 0}
            d = train_dlrm(paths[: size // DAY_ROWS], paths[-1:], options, work / "runs")
            print(
                f"| {size:,} | {frequency} | {d['auc']:.4f} | {d['log_loss']:.4f} | {logistic['auc']:.4f} | "
                f"{logistic['log_loss']:.4f} |",
                flush=True,
            )


TERABYTE_SPLITS = ((5000, 5000), (7500, 2500))  # (training rows, validation rows) of the real Terabyte rows


def terabyte_days(work: Path, train_rows: int) -> tuple[list[Path], list[Path]]:
    """The real Criteo 1TB rows (day_0's first 10,000, CTR 2.65%): the first ``train_rows`` train, the rest validate."""
    lines = (REAL_DATA / "terabyte_day0_first10k.tsv").read_text().splitlines(keepends=True)
    (work / "tb_train").write_text("".join(lines[:train_rows]))
    (work / "tb_validation").write_text("".join(lines[train_rows:]))
    return [
        Path(convert_day(work / name, work / f"{name}.parquet", progress=False).parquet) for name in ("tb_train",)
    ], [Path(convert_day(work / "tb_validation", work / "tb_validation.parquet", progress=False).parquet)]


def small_data_rule(work: Path, frequencies: list[int], sizes: list[int], validation_rows: int) -> None:
    """The DLRM with the defaults but ``min_frequency`` (the small-data rule off), and with the defaults
    (``rule``: the threshold ``metadata.min_expected_clicks`` sets), against the logistic regression's best of
    4, where clicks are few: the real Terabyte rows (at two splits), the real Kaggle rows, and the planted
    click model at ``--ctr`` for ``sizes`` training rows. Seeds 0-2 up to 100,000 rows, seed 0 above.
    NE above 1: worse than predicting the average click rate."""
    import statistics

    default = MetadataConfig()
    print(f"\nthe rule: min_frequency {default.min_frequency}, min_expected_clicks {default.min_expected_clicks:g}")
    print(
        "\n| data | training rows | training clicks | min_frequency | DLRM AUC | DLRM NE (mean +- sd) | LR AUC | LR NE |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")

    def rows(name: str, train: list[Path], validation: list[Path]) -> None:
        labels = np.concatenate([pq.read_table(p).column("labels").to_numpy() for p in train])
        clicks = int(labels.sum())
        logistic = best([train_logistic(train, validation, options) for options in REAL_LOGISTIC_GRID])
        seeds = range(3) if len(labels) <= 100_000 else range(1)
        settings = [(str(f), {"metadata.min_frequency": f, "metadata.min_expected_clicks": 0}) for f in frequencies]
        rule = default.effective_min_frequency(clicks / len(labels))
        settings.append((f"rule: {rule}", {"metadata.min_frequency": default.min_frequency,
                                           "metadata.min_expected_clicks": default.min_expected_clicks}))  # fmt: skip
        for label, setting in settings:
            runs = [
                train_dlrm(train, validation, {**CURVE_SETTINGS, **setting, "training.seed": s}, work / "runs")
                for s in seeds
            ]
            auc, ne = [r["auc"] for r in runs], [r["normalized_entropy"] for r in runs]
            spread = f" +- {statistics.stdev(ne):.4f}" if len(runs) > 1 else ""
            print(
                f"| {name} | {len(labels):,} | {clicks:,} | {label} | {statistics.mean(auc):.4f} | "
                f"{statistics.mean(ne):.4f}{spread} | {logistic['auc']:.4f} | {logistic['normalized_entropy']:.4f} |",
                flush=True,
            )

    if REAL_DATA.is_dir():
        for train_rows, _ in TERABYTE_SPLITS:
            rows("real Terabyte (2.65%)", *terabyte_days(work, train_rows))
        rows("real Kaggle (22%)", *real_days(work))
    paths, _ = generated_days(work, -(-max(sizes) // DAY_ROWS), validation_rows)
    for size in sizes:
        days = -(-size // DAY_ROWS)
        train = paths[:days]
        if size % DAY_ROWS:  # a part of the first day
            table = pq.read_table(paths[0]).slice(0, size)
            pq.write_table(table, work / f"part_{size}.parquet")
            train = [work / f"part_{size}.parquet"]
        rows(f"planted, CTR {WORLD_CTR['ctr']:.0%}", train, paths[-1:])


# The worlds of the loader study: the planted model at 25% and 3% clicks, and one whose click rate drifts from
# day to day (5% on day 0, +3 points a day), the days stored in order, as ingestion writes them.
LOADER_WORLDS = {
    "25% clicks": lambda day: 0.25,
    "3% clicks": lambda day: 0.03,
    "drifting": lambda day: 0.05 + 0.03 * day,
}


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


def loader_study(size: int, validation_rows: int, work: Path, seeds: list[int], chunk_rows: int) -> None:
    """Model quality with each way of shuffling, on the same rows, over seeds, one epoch each (the best epoch at
    1M rows): a full permutation of day-ordered rows (the loader before chunks: ``PermutationLoader``); the
    pipeline's way (rows stored shuffled by encoding, read in chunks); and chunks of day-ordered rows (what
    ``BatchLoader`` does by itself with rows stored in day order; drifting world only).

    ``chunk_rows`` scales the loader's chunk to the study: at Criteo 1TB a window (16 chunks of 65,536 rows) is
    0.02% of the rows; at 1M rows, chunks of 1,024 rows make it 1.6% (a window of all the rows would shuffle fully).
    """
    import criteo_dlrm.data.batches as batches
    import criteo_dlrm.engine.process as process
    from criteo_dlrm.data.batches import BatchLoader
    from criteo_dlrm.data.chunk_digests import write_digests
    from criteo_dlrm.data.stored import open_encoded

    from baselines import PermutationLoader

    days = size // DAY_ROWS
    results = []
    for world, ctr_of in LOADER_WORLDS.items():
        paths = world_days(work, world, days, validation_rows, ctr_of)
        options = {**CURVE_SETTINGS, "training.num_epochs": 1}
        metadata, vocabularies, in_order, validation = encode(paths[:-1], paths[-1:], options)
        stored = paths[0].parent / "train_shuffled"
        FeatureEncoder.from_metadata(metadata, vocabularies).encode_days(paths[:-1], into=stored, shuffle=True)
        write_digests(stored)
        ways = {
            "full permutation (before)": (PermutationLoader, in_order),
            "stored shuffled, chunks (pipeline)": (BatchLoader, open_encoded(stored)),
        }
        if world == "drifting":
            ways["day order, chunks"] = (BatchLoader, in_order)
        for way, (loader, train) in ways.items():
            for seed in seeds:
                process.BatchLoader, default_chunk = loader, batches.CHUNK_ROWS
                batches.CHUNK_ROWS = chunk_rows
                try:
                    got = fit_dlrm(
                        (metadata, vocabularies, train, validation), {**options, "training.seed": seed}, work / "tb"
                    )
                finally:
                    process.BatchLoader, batches.CHUNK_ROWS = BatchLoader, default_chunk
                results.append({"world": world, "way": way, "seed": seed, **got})
                print(f"{world}, {way}, seed {seed}: AUC {got['auc']:.4f}, log loss {got['log_loss']:.4f}", flush=True)
    print(
        f"\n{size:,} training rows ({days} days), one epoch, seeds {seeds}, chunks of {chunk_rows:,} rows, "
        f"windows of {batches.WINDOW_CHUNKS}; mean +- standard deviation over seeds:\n"
    )
    print("| world | shuffle | AUC | log loss | AUC - full permutation's |\n| --- | --- | ---: | ---: | ---: |")
    for world in LOADER_WORLDS:
        base = np.mean([r["auc"] for r in results if r["world"] == world and r["way"].startswith("full")])
        for way in dict.fromkeys(r["way"] for r in results if r["world"] == world):
            mine = [r for r in results if r["world"] == world and r["way"] == way]
            auc, loss = np.array([r["auc"] for r in mine]), np.array([r["log_loss"] for r in mine])
            print(
                f"| {world} | {way} | {auc.mean():.4f} +- {auc.std(ddof=1) if len(auc) > 1 else 0:.4f} | "
                f"{loss.mean():.4f} +- {loss.std(ddof=1) if len(loss) > 1 else 0:.4f} | {auc.mean() - base:+.4f} |"
            )


PRECISION_WORLDS = {"25% clicks": 0.25, "3% clicks": 0.03}


def precision_study(size: int, validation_rows: int, work: Path, seeds: list[int]) -> None:
    """Model quality trained in bf16 against fp32 (``training.precision``), the learning curve's settings, on the
    same rows, over seeds (each seed the same initial model and batches for both precisions), at 25% and 3% clicks.
    bf16 holds when its mean AUC and log loss are within one standard error (of the mean over seeds) of fp32's."""
    from machine import describe_machine

    describe_machine()
    days = size // DAY_ROWS
    results = []
    for world, ctr in PRECISION_WORLDS.items():
        paths = world_days(work, world, days, validation_rows, lambda day, ctr=ctr: ctr)
        encoded = encode(paths[:-1], paths[-1:], CURVE_SETTINGS)
        for seed in seeds:
            for precision in ("fp32", "bf16"):
                options = {**CURVE_SETTINGS, "training.seed": seed, "training.precision": precision}
                got = fit_dlrm(encoded, options, work / "tb")
                results.append({"world": world, "precision": precision, "seed": seed, **got})
                print(
                    f"{world}, {precision}, seed {seed}: AUC {got['auc']:.4f}, log loss {got['log_loss']:.5f}, "
                    f"best at step {got['step']:,}, {got['seconds_total']:.0f} s",
                    flush=True,
                )
    print(
        f"\n{size:,} training rows ({days} days), {validation_rows:,} validation rows, seeds {seeds}; "
        "mean +- standard error over seeds:\n"
    )
    print(
        "| world | precision | AUC | log loss | AUC - fp32's | log loss - fp32's | within one standard error |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | --- |"
    )
    for world in PRECISION_WORLDS:
        by = {
            precision: {
                metric: np.array([r[metric] for r in results if r["world"] == world and r["precision"] == precision])
                for metric in ("auc", "log_loss")
            }
            for precision in ("fp32", "bf16")
        }
        for precision, metrics in by.items():
            cells, within = [], []
            for metric, values in metrics.items():
                error = values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else 0.0
                cells.append(f"{values.mean():.5f} +- {error:.5f}")
                base = by["fp32"][metric]
                base_error = base.std(ddof=1) / np.sqrt(len(base)) if len(base) > 1 else 0.0
                within.append(abs(values.mean() - base.mean()) <= base_error)
            differences = [f"{metrics[m].mean() - by['fp32'][m].mean():+.5f}" for m in metrics]
            print(
                f"| {world} | {precision} | {' | '.join(cells)} | {' | '.join(differences)} | "
                f"{'-' if precision == 'fp32' else ('yes' if all(within) else 'no')} |"
            )


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    interactions = list(dict.fromkeys(r["interaction"] for r in results))
    first = [r for r in results if r["interaction"] == interactions[0]]
    sizes = [r["rows"] for r in first]
    curves = [(f"DLRM, {i}", [r["dlrm"] for r in results if r["interaction"] == i]) for i in interactions]
    curves += [("hashed logistic regression", [r["logistic"] for r in first])]
    curves += [("oracle (true probabilities)", [r["oracle"] for r in first])]
    for label, points in curves:
        left.plot(sizes, [p["auc"] for p in points], marker="o", label=label)
        right.plot(sizes, [p["log_loss"] for p in points], marker="o", label=label)
    for axes, name in ((left, "validation AUC"), (right, "validation log loss")):
        axes.set(xscale="log", xlabel="training rows", ylabel=name, title=f"{name} by training size")
        axes.grid(alpha=0.3)
        axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000, 1_000_000, 3_000_000])
    parser.add_argument("--validation-rows", type=int, default=200_000)
    parser.add_argument("--plot", type=Path, default=Path("benchmarks/results/learning_curve.png"))
    parser.add_argument("--interactions", nargs="+", default=list(INTERACTIONS))
    parser.add_argument("--validations-per-epoch", type=int, help="default: conf/base's")
    parser.add_argument("--skip-real", action="store_true")
    parser.add_argument("--remedies", type=int, metavar="ROWS", help="only compare the remedies at this size")
    parser.add_argument(
        "--reference", type=int, metavar="ROWS", help="only compare the defaults with the planted form, learned"
    )
    parser.add_argument("--only", nargs="+", help="with --remedies: these settings only (names as printed)")
    parser.add_argument("--min-frequencies", type=int, nargs="+", help="only compare these metadata.min_frequency")
    parser.add_argument("--ctr", type=float, default=0.25, help="the planted click model's base rate")
    parser.add_argument("--loaders", type=int, metavar="ROWS", help="only compare the ways of shuffling at this size")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="with --loaders or --precisions")
    parser.add_argument("--precisions", type=int, metavar="ROWS", help="only compare bf16 with fp32 at this size")
    parser.add_argument("--chunk-rows", type=int, default=1024, help="with --loaders: the loader's chunk")
    parser.add_argument(
        "--small-data",
        type=int,
        nargs="*",
        metavar="MIN_FREQUENCY",
        help="only the small-data study at these (and the default rule; none given: the rule alone)",
    )
    args = parser.parse_args()
    WORLD_CTR["ctr"] = args.ctr
    if args.loaders:
        with tempfile.TemporaryDirectory() as tmp:
            loader_study(args.loaders, args.validation_rows, Path(tmp), args.seeds, args.chunk_rows)
        return
    if args.precisions:
        with tempfile.TemporaryDirectory() as tmp:
            precision_study(args.precisions, args.validation_rows, Path(tmp), args.seeds)
        return
    if args.small_data is not None:
        with tempfile.TemporaryDirectory() as tmp:
            small_data_rule(Path(tmp), args.small_data, sorted(args.sizes), args.validation_rows)
        return
    if any(size % DAY_ROWS for size in args.sizes):
        parser.error(f"sizes must be multiples of {DAY_ROWS:,}")
    if args.min_frequencies:
        with tempfile.TemporaryDirectory() as tmp:
            small_data(Path(tmp), args.min_frequencies, sorted(args.sizes), args.validation_rows)
        return
    if args.reference:
        with tempfile.TemporaryDirectory() as tmp:
            reference(args.reference, args.validation_rows, Path(tmp))
        return
    if args.remedies:
        with tempfile.TemporaryDirectory() as tmp:
            remedies(args.remedies, args.validation_rows, Path(tmp), args.only)
        return
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        print("generated data (planted click model):", flush=True)
        overrides = {"training.validations_per_epoch": args.validations_per_epoch} if args.validations_per_epoch else {}
        results = learning_curve(sorted(args.sizes), args.validation_rows, work, tuple(args.interactions), overrides)
        real = None if args.skip_real else real_rows(work)
    print(
        "\n| training rows | interaction | DLRM AUC | LR AUC | oracle AUC | DLRM log loss | LR log loss | oracle log loss "
        "| LR-to-oracle gap closed | best at step (epoch) | training s to best | first epoch s | training s in all |"
    )
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        d, lr, o = r["dlrm"], r["logistic"], r["oracle"]
        closed = (d["auc"] - lr["auc"]) / (o["auc"] - lr["auc"])
        first = f"{d['seconds_first_epoch']:.0f}" if d["seconds_first_epoch"] is not None else "(stopped in it)"
        print(
            f"| {r['rows']:,} | {r['interaction']} | {d['auc']:.4f} | {lr['auc']:.4f} | {o['auc']:.4f} | "
            f"{d['log_loss']:.4f} | {lr['log_loss']:.4f} | {o['log_loss']:.4f} | {closed:.0%} | "
            f"{d['step']:,} ({d['epoch']}) | {d['seconds_to_best']:.0f} | {first} | {d['seconds_total']:.0f} |"
        )
    if real is not None:
        dlrm, logistic = real
        print("\nreal Criteo rows (Kaggle first 10k -> Kaggle random 4,584):\n")
        print(
            "| model | AUC | log loss | normalized entropy | chosen settings (best of 4 by log loss) |\n| --- | ---: | ---: | ---: | --- |"
        )
        for name, m in (("DLRM (ours)", dlrm), ("hashed logistic regression", logistic)):
            print(
                f"| {name} | {m['auc']:.4f} | {m['log_loss']:.4f} | {m['normalized_entropy']:.4f} | {m['settings']} |"
            )
    plot(results, args.plot)
    print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
