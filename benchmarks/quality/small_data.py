"""Model quality where clicks are few: the small-data rule (``metadata.min_expected_clicks``) against fixed
``min_frequency`` values and the logistic regression, on the real Terabyte and Kaggle rows and the planted click
model.

    python -m benchmarks.quality.small_data --min-frequencies 3 10 40 100 400 --ctr 0.03 --sizes 5000 100000
"""

from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from benchmarks.harness import Table
from benchmarks.quality.common import (
    CURVE_SETTINGS,
    DAY_ROWS,
    REAL_DATA,
    REAL_LOGISTIC_GRID,
    WORLD_CTR,
    best,
    generated_days,
    in_a_work_folder,
    real_days,
    study_arguments,
    train_dlrm,
    train_logistic,
)
from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data.raw import convert_day

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

    default = MetadataConfig()
    print(f"\nthe rule: min_frequency {default.min_frequency}, min_expected_clicks {default.min_expected_clicks:g}")
    print()
    table = Table("data", "training rows", "training clicks", "min_frequency", "DLRM AUC", "DLRM NE (mean +- sd)",
                  "LR AUC", "LR NE")  # fmt: skip

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
            table.row(name, f"{len(labels):,}", f"{clicks:,}", label, f"{statistics.mean(auc):.4f}",
                      f"{statistics.mean(ne):.4f}{spread}", f"{logistic['auc']:.4f}",
                      f"{logistic['normalized_entropy']:.4f}")  # fmt: skip

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


def main() -> None:
    parser = study_arguments(__doc__)
    parser.add_argument(
        "--min-frequencies", type=int, nargs="*", default=[], help="besides the rule (none: the rule alone)"
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000, 1_000_000, 3_000_000],
                        help="training rows of the planted click model (a part of a day too)")  # fmt: skip
    args = parser.parse_args()
    in_a_work_folder(
        args, lambda work: small_data_rule(work, args.min_frequencies, sorted(args.sizes), args.validation_rows)
    )


if __name__ == "__main__":
    main()
