"""Model quality trained in bf16 against fp32 at 25% and 3% clicks, over seeds.

python -m benchmarks.quality.precision --rows 1000000 --seeds 0 1 2
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.harness import Table
from benchmarks.quality.common import (
    CURVE_SETTINGS,
    DAY_ROWS,
    encode,
    fit_dlrm,
    in_a_work_folder,
    study_arguments,
    world_days,
)

PRECISION_WORLDS = {"25% clicks": 0.25, "3% clicks": 0.03}


def precision_study(size: int, validation_rows: int, work: Path, seeds: list[int]) -> None:
    """Model quality trained in bf16 against fp32 (``training.precision``), the learning curve's settings, on the
    same rows, over seeds (each seed the same initial model and batches for both precisions), at 25% and 3% clicks.
    bf16 holds when its mean AUC and log loss are within one standard error (of the mean over seeds) of fp32's."""
    from benchmarks.harness import describe_machine

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
    table = Table("world", "precision", "AUC", "log loss", "AUC - fp32's", "log loss - fp32's",
                  "within one standard error", align="llrrrrl")  # fmt: skip
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
            table.row(
                world, precision, *cells, *differences, "-" if precision == "fp32" else ("yes" if all(within) else "no")
            )


def main() -> None:
    parser = study_arguments(__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="training rows, a multiple of 100,000")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    in_a_work_folder(args, lambda work: precision_study(args.rows, args.validation_rows, work, args.seeds))


if __name__ == "__main__":
    main()
