"""Post-hoc calibration on test rows nobody tuned on: the raw model output against Platt scaling and isotonic
regression, each fitted on the validation rows, on generated worlds at 25% and 3% click rates, the bundled
sample, and the real Kaggle rows.

Each world is split as ``kedro run`` splits it: training days, and a validation day whose first half
validates (early stopping, the calibration fit) and whose second half tests (every figure here). The DLRM
has the project's defaults (conf/base), trained by the product's recipe (``engine.training.recipe.run_training``).

    python -m benchmarks.calibration [--train-rows 1000000] [--validation-rows 1000000]
"""

from __future__ import annotations

import dataclasses
import math
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.harness import ROOT, Arguments, Table, cpu_model
from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.data.parquet import DayRows, count_rows
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.synthetic import ClickModel, write_day
from criteo_dlrm.engine.device import Runtime
from criteo_dlrm.engine.trained.calibration import from_state
from criteo_dlrm.engine.trained.metrics import binary_metrics, calibration_report
from criteo_dlrm.engine.trained.scoring import calibrated, score_days
from criteo_dlrm.engine.training.recipe import calibrate, run_training

REAL_DATA = ROOT.parent / "shared" / "data" / "criteo_real"
CPU = torch.device("cpu")
DAY_ROWS = 100_000


def halves(path: Path) -> tuple[DayRows, DayRows]:
    """The validation day's first half (validation) and second half (test), as ``metadata.test_share: 0.5``."""
    rows = count_rows([path])
    test = int(rows * MetadataConfig().test_share)
    return DayRows(str(path), 0, rows - test), DayRows(str(path), rows - test, rows)


def measure(name: str, train: list[Path], validation_day: Path, work: Path, table: Table) -> list[list[str]]:
    """Train with the defaults, calibrate each way on the validation half, report each on the test half."""
    validation, test = halves(validation_day)
    metadata, vocabularies = compute_feature_metadata(train, MetadataConfig(), progress=False)
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    train_rows, validation_rows = encoder.encode_days(train), encoder.encode_days([validation])
    config = TrainingConfig.from_dict(
        {"device": "cpu", "resume": False, "tensorboard_dir": str(work / "tb"), "log_every_steps": 1000}
    )
    checkpoint, _ = run_training(config, train_rows, validation_rows, metadata, vocabularies, name)
    fits = {"none (raw output)": {"method": "none"}, "platt": checkpoint.calibration_state}
    model = checkpoint.model()
    fits["isotonic"] = calibrate(
        model, validation_rows, dataclasses.replace(config, calibration="isotonic"), Runtime(CPU, config.precision)
    )
    labels, logits = score_days(model, encoder, [test], progress=False)
    ctr = labels.mean()
    # The calibration ratio's standard error from the test rows alone (binomial): the noise floor of "1.00".
    noise = math.sqrt((1 - ctr) / (ctr * len(labels)))
    rows = []
    for method, state in fits.items():
        probabilities = calibrated(from_state(state), logits)
        metrics = binary_metrics(labels, probabilities)
        report = calibration_report(labels, probabilities)
        deciles = [b["calibration"] for b in report.bins if b["calibration"] is not None]
        rows.append([name, f"{len(labels):,} ({ctr:.1%})", method, f"{metrics.calibration:.3f} +- {noise:.3f}",
                     f"{report.expected_calibration_error:.4f}", f"{min(deciles):.2f} - {max(deciles):.2f}",
                     f"{metrics.log_loss:.5f}", f"{metrics.auc:.4f}"])  # fmt: skip
        table.row(*rows[-1])
    return rows


def generated(work: Path, ctr: float, train_rows: int, validation_rows: int) -> tuple[list[Path], Path]:
    model, paths = ClickModel(0, ctr=ctr), []
    days = -(-train_rows // DAY_ROWS)
    for day in range(days + 1):
        rows = validation_rows if day == days else min(DAY_ROWS, train_rows - day * DAY_ROWS)
        write_day(work / f"day_{day}", rows, day=day, model=model)
        paths.append(Path(convert_day(work / f"day_{day}", work / f"day_{day}.parquet", progress=False).parquet))
    return paths[:-1], paths[-1]


# What the tests run (--smallest): this benchmark at its smallest sizes.
SMALLEST = ["--train-rows", "10000", "--validation-rows", "10000", "--ctrs", "0.25"]


def main() -> None:
    parser = Arguments(__doc__, SMALLEST)
    parser.add_argument("--train-rows", type=int, default=1_000_000)
    parser.add_argument("--validation-rows", type=int, default=1_000_000)
    parser.add_argument("--ctrs", type=float, nargs="+", default=[0.25, 0.03])
    args = parser.parse_args()
    print(f"{cpu_model()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}\n")
    columns = ("data", "test rows (CTR)", "calibration", "test calibration +- its standard error", "ECE (deciles)",
               "decile calibration, lowest - highest", "test log loss", "test AUC")  # fmt: skip
    table, rows = Table(*columns, align="lrlrrrrr"), []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        sample = [Path(convert_day(ROOT / "data/01_raw" / f"day_{d}.gz", work / f"sample_{d}.parquet",
                                   progress=False).parquet) for d in range(3)]  # fmt: skip
        rows += measure("bundled sample (25%)", sample[:2], sample[2], work / "sample", table)
        if REAL_DATA.is_dir():
            train = convert_day(REAL_DATA / "kaggle_dac_train_first10k.tsv", work / "kaggle.parquet", progress=False)
            held_out = convert_day(REAL_DATA / "kaggle_dac_train_random4584.tsv", work / "held.parquet", progress=False)
            rows += measure("real Kaggle rows", [Path(train.parquet)], Path(held_out.parquet), work / "kaggle", table)
        for ctr in args.ctrs:
            folder = work / f"ctr_{ctr}"
            folder.mkdir()
            train_paths, validation_day = generated(folder, ctr, args.train_rows, args.validation_rows)
            name = f"planted {ctr:.0%}, {args.train_rows:,} training rows"
            rows += measure(name, train_paths, validation_day, folder, table)
    print()  # again, whole: the training's log lines came between the rows above
    table = Table(*columns, align="lrlrrrrr")
    for row in rows:
        table.row(*row)


if __name__ == "__main__":
    main()
