"""Model quality: the DLRM's defaults against a model of the planted click model's own form, learned from the
same rows: how much of the gap to the oracle a training size allows.

    python -m benchmarks.quality.reference --rows 2000000
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.baselines import train_planted_form
from benchmarks.harness import Table
from benchmarks.quality.common import (
    CURVE_SETTINGS,
    DAY_ROWS,
    WORLD_CTR,
    WORLD_SEED,
    encode,
    fit_dlrm,
    generated_days,
    in_a_work_folder,
    study_arguments,
    train_logistic,
)
from criteo_dlrm.data.synthetic import ClickModel

# The planted model's own form, learned: the DLRM's table optimiser at three rates, and Adagrad.
PLANTED_FORM_GRID = [("sparse_adam", 0.001), ("sparse_adam", 0.003), ("sparse_adam", 0.01), ("adagrad", 0.05)]


def reference(size: int, validation_rows: int, work: Path) -> None:
    """The DLRM's defaults against a model of the planted click model's own form (which features act alone,
    which pairs interact and at what rank), learned from the same rows and encoded the same way."""
    paths, oracle = generated_days(work, size // DAY_ROWS, validation_rows)
    logistic = train_logistic(paths[:-1], paths[-1:], {})
    print(f"\n{size:,} training rows; LR AUC {logistic['auc']:.4f}, oracle AUC {oracle['auc']:.4f}\n")
    table = Table("model", "AUC", "log loss", "LR-to-oracle gap closed", "best epoch")

    def row(name: str, result: dict) -> None:
        closed = (result["auc"] - logistic["auc"]) / (oracle["auc"] - logistic["auc"])
        table.row(name, f"{result['auc']:.4f}", f"{result['log_loss']:.4f}", f"{closed:.0%}", result["epoch"])

    encoded = encode(paths[:-1], paths[-1:], CURVE_SETTINGS)
    row("DLRM, defaults", fit_dlrm(encoded, CURVE_SETTINGS, work / "runs"))
    metadata, _, train, validation = encoded
    table_sizes = metadata.table_sizes
    pairs = ClickModel(WORLD_SEED, **WORLD_CTR).pairs
    for optimizer, lr in PLANTED_FORM_GRID:
        row(f"planted form, {optimizer} {lr}", train_planted_form(train, validation, table_sizes, pairs, optimizer, lr))


def main() -> None:
    parser = study_arguments(__doc__)
    parser.add_argument("--rows", type=int, default=2_000_000, help="training rows, a multiple of 100,000")
    args = parser.parse_args()
    in_a_work_folder(args, lambda work: reference(args.rows, args.validation_rows, work))


if __name__ == "__main__":
    main()
