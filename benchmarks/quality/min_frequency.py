"""Model quality: ``metadata.min_frequency`` with the other defaults, on the real rows (3 seeds each) and on
generated data.

    python -m benchmarks.quality.min_frequency --min-frequencies 3 10 20 40 80 --sizes 100000 1000000
"""

from __future__ import annotations

import statistics
from pathlib import Path

from benchmarks.harness import Table
from benchmarks.quality.common import (
    CURVE_SETTINGS,
    DAY_ROWS,
    REAL_DATA,
    REAL_LOGISTIC_GRID,
    best,
    generated_days,
    in_a_work_folder,
    real_days,
    study_arguments,
    train_dlrm,
    train_logistic,
)


def small_data(work: Path, frequencies: list[int], sizes: list[int], validation_rows: int) -> None:
    """``metadata.min_frequency`` with the other defaults: on the real rows (3 seeds each, against the logistic
    regression's best of 4) and on generated data of ``sizes`` rows (one seed)."""

    if REAL_DATA.is_dir():
        train, validation = real_days(work)
        logistic = best([train_logistic(train, validation, options) for options in REAL_LOGISTIC_GRID])
        print(f"\nreal rows (Kaggle first 10k -> random 4,584); LR AUC {logistic['auc']:.4f}, "
              f"log loss {logistic['log_loss']:.4f}; DLRM with the defaults but min_frequency, seeds 0-2\n")  # fmt: skip
        table = Table("min_frequency", "AUC (mean +- sd)", "log loss (mean +- sd)", "log loss - LR's", align="rrrr")
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
            table.row(frequency, f"{statistics.mean(auc):.4f} +- {statistics.stdev(auc):.4f}",
                      f"{statistics.mean(loss):.4f} +- {statistics.stdev(loss):.4f}",
                      f"{statistics.mean(loss) - logistic['log_loss']:+.4f}")  # fmt: skip
    paths, _ = generated_days(work, max(sizes) // DAY_ROWS, validation_rows)
    print("\ngenerated data, DLRM with the defaults but min_frequency\n")
    table = Table("training rows", "min_frequency", "AUC", "log loss", "LR AUC", "LR log loss", align="rrrrrr")
    for size in sizes:
        logistic = train_logistic(paths[: size // DAY_ROWS], paths[-1:], {})
        for frequency in frequencies:
            options = {**CURVE_SETTINGS, "metadata.min_frequency": frequency, "metadata.min_expected_clicks": 0}
            d = train_dlrm(paths[: size // DAY_ROWS], paths[-1:], options, work / "runs")
            table.row(f"{size:,}", frequency, f"{d['auc']:.4f}", f"{d['log_loss']:.4f}", f"{logistic['auc']:.4f}",
                      f"{logistic['log_loss']:.4f}")  # fmt: skip


def main() -> None:
    parser = study_arguments(__doc__)
    parser.add_argument("--min-frequencies", type=int, nargs="+", default=[3, 10, 20, 40, 80])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    args = parser.parse_args()
    if any(size % DAY_ROWS for size in args.sizes):
        parser.error(f"sizes must be multiples of {DAY_ROWS:,}")
    in_a_work_folder(
        args, lambda work: small_data(work, args.min_frequencies, sorted(args.sizes), args.validation_rows)
    )


if __name__ == "__main__":
    main()
