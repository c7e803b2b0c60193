"""Model quality: known remedies for the one-epoch overfitting, each against the defaults on the same rows
of the planted click model (docs/benchmarks.md, "Low click rates").

    python -m benchmarks.quality.remedies --rows 1000000 [--ctr 0.03] [--only "defaults" "min_expected_clicks 30"]
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.harness import Table
from benchmarks.quality.common import (
    CURVE_SETTINGS,
    DAY_ROWS,
    embedding_size,
    generated_days,
    in_a_work_folder,
    study_arguments,
    train_dlrm,
    train_logistic,
)

# Known remedies for the one-epoch overfitting, each against the defaults on the same data.
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
    table = Table("setting", "AUC", "log loss", "calibration", "LR-to-oracle gap closed", "best at step (epoch)",
                  "training s to best", "training s in all")  # fmt: skip
    for name, change in REMEDIES.items():
        if names and name not in names:
            continue
        d = train_dlrm(
            paths[:-1], paths[-1:], {**CURVE_SETTINGS, "training.validations_per_epoch": 4, **change}, work / "runs"
        )
        closed = (d["auc"] - logistic["auc"]) / (oracle["auc"] - logistic["auc"])
        table.row(name, f"{d['auc']:.4f}", f"{d['log_loss']:.4f}", f"{d['calibration']:.3f}", f"{closed:.0%}",
                  f"{d['step']:,} ({d['epoch']})", f"{d['seconds_to_best']:.0f}", f"{d['seconds_total']:.0f}")  # fmt: skip


def main() -> None:
    parser = study_arguments(__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="training rows, a multiple of 100,000")
    parser.add_argument("--only", nargs="+", help="these settings only (names as printed)")
    args = parser.parse_args()
    in_a_work_folder(args, lambda work: remedies(args.rows, args.validation_rows, work, args.only))


if __name__ == "__main__":
    main()
