"""Model quality: a learning curve of our DLRM against a hashed logistic regression and the oracle.

On generated data (the planted click model, so the best achievable AUC and log loss are known), for
several training sizes; and on the real Criteo rows in ../shared/data/criteo_real (train on the Kaggle
first 10k, validate on the Kaggle random 4,584) when that folder exists.

    python -m benchmarks.quality.curve [--sizes 100000 300000 1000000 3000000] [--plot benchmarks/results/learning_curve.png]
    python -m benchmarks.quality.curve --ctr 0.03 --sizes 100000 300000 1000000 3000000         # a low click rate
"""

from __future__ import annotations

import time
from pathlib import Path

from benchmarks.harness import Table
from benchmarks.quality.common import (
    CURVE_SETTINGS,
    DAY_ROWS,
    INTERACTIONS,
    generated_days,
    in_a_work_folder,
    real_rows,
    study_arguments,
    train_dlrm,
    train_logistic,
)


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
    parser = study_arguments(__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 300_000, 1_000_000, 3_000_000])
    parser.add_argument("--plot", type=Path, default=Path("benchmarks/results/learning_curve.png"))
    parser.add_argument("--interactions", nargs="+", default=list(INTERACTIONS))
    parser.add_argument("--validations-per-epoch", type=int, help="default: conf/base's")
    parser.add_argument("--skip-real", action="store_true")
    args = parser.parse_args()
    if any(size % DAY_ROWS for size in args.sizes):
        parser.error(f"sizes must be multiples of {DAY_ROWS:,}")
    found = {}

    def run(work: Path) -> None:
        print("generated data (planted click model):", flush=True)
        overrides = {"training.validations_per_epoch": args.validations_per_epoch} if args.validations_per_epoch else {}
        found["curve"] = learning_curve(
            sorted(args.sizes), args.validation_rows, work, tuple(args.interactions), overrides
        )
        found["real"] = None if args.skip_real else real_rows(work)

    in_a_work_folder(args, run)
    print()
    table = Table("training rows", "interaction", "DLRM AUC", "LR AUC", "oracle AUC", "DLRM log loss", "LR log loss",
                  "oracle log loss", "LR-to-oracle gap closed", "best at step (epoch)", "training s to best",
                  "first epoch s", "training s in all", align="rl" + "r" * 11)  # fmt: skip
    for r in found["curve"]:
        d, lr, o = r["dlrm"], r["logistic"], r["oracle"]
        closed = (d["auc"] - lr["auc"]) / (o["auc"] - lr["auc"])
        first = f"{d['seconds_first_epoch']:.0f}" if d["seconds_first_epoch"] is not None else "(stopped in it)"
        table.row(f"{r['rows']:,}", r["interaction"], f"{d['auc']:.4f}", f"{lr['auc']:.4f}", f"{o['auc']:.4f}",
                  f"{d['log_loss']:.4f}", f"{lr['log_loss']:.4f}", f"{o['log_loss']:.4f}", f"{closed:.0%}",
                  f"{d['step']:,} ({d['epoch']})", f"{d['seconds_to_best']:.0f}", first, f"{d['seconds_total']:.0f}")  # fmt: skip
    if found["real"] is not None:
        dlrm, logistic = found["real"]
        print("\nreal Criteo rows (Kaggle first 10k -> Kaggle random 4,584):\n")
        table = Table("model", "AUC", "log loss", "normalized entropy", "chosen settings (best of 4 by log loss)",
                      align="lrrrl")  # fmt: skip
        for name, m in (("DLRM (ours)", dlrm), ("hashed logistic regression", logistic)):
            table.row(name, f"{m['auc']:.4f}", f"{m['log_loss']:.4f}", f"{m['normalized_entropy']:.4f}", m["settings"])
    plot(found["curve"], args.plot)
    print(f"\nplot: {args.plot}")


if __name__ == "__main__":
    main()
