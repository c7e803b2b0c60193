"""A checkpoint as an MLflow model: ``mlflow.pyfunc.load_model(uri).predict(rows)`` returns the scoring
pipeline's calibrated click probabilities for raw Criteo rows.

The input is a pandas DataFrame with one row per click-log line and the columns ``DENSE_0`` … ``DENSE_12``
(the integer counts as numbers of any numeric type, int64, float64 or pandas' nullable Int64, NaN, None or NA
when missing) and ``SPARSE_0`` … ``SPARSE_25`` (the category
values as the hex strings of the raw files, None or "" when missing). The model holds the checkpoint
(weights, encoder, calibration) and this package's code, so it loads wherever torch, numpy, pandas and
pyarrow are installed.
"""

# No ``from __future__ import annotations`` here: MLflow reads ``predict``'s type hints at class definition.
from pathlib import Path

import mlflow.pyfunc
import numpy as np
import pandas as pd
import pyarrow as pa

from criteo_dlrm.common.schema import DENSE_COLUMNS, FEATURE_COLUMNS, SPARSE_COLUMNS

CHECKPOINT_ARTIFACT = "checkpoint"
MODEL_NAME = "model"  # the model's name within its run: runs:/<run id>/model


def typed_rows(rows: pd.DataFrame) -> pa.RecordBatch:
    """Raw fields (numbers and hex strings, as above) -> a record batch in ingestion's typed layout.

    Raises:
        ValueError: a column is missing, or a category value is not hexadecimal (naming the column).
    """
    missing = [name for name in FEATURE_COLUMNS if name not in rows.columns]
    if missing:
        raise ValueError(f"the rows lack the columns {missing[:5]}{' ...' if len(missing) > 5 else ''}")
    arrays = []
    for name in DENSE_COLUMNS:
        values = pd.to_numeric(rows[name], errors="raise").astype("float64").to_numpy()
        arrays.append(pa.array(np.nan_to_num(values).astype(np.int64), mask=np.isnan(values)))
    for name in SPARSE_COLUMNS:
        text = rows[name].astype("string").fillna("")
        try:
            values = [int(value, 16) if value else None for value in text]
        except ValueError as error:
            raise ValueError(f"{name}: a category value is not a hexadecimal id ({error})") from None
        arrays.append(pa.array(values, pa.int64()))
    return pa.RecordBatch.from_arrays(arrays, names=FEATURE_COLUMNS)


class CheckpointModel(mlflow.pyfunc.PythonModel):
    """The pyfunc flavour of a checkpoint: its encoder, model and calibration, on the CPU."""

    def load_context(self, context) -> None:
        from criteo_dlrm.engine.trained.checkpoint import Checkpoint, load_checkpoint

        path = Path(context.artifacts[CHECKPOINT_ARTIFACT])
        if path.is_dir():  # a sharded run's checkpoint: the file and the state folder it names
            [path] = path.glob("*.pt")
        # Mapped, not read: the optimiser state (twice the tables with Adagrad, three times with Adam) is never
        # in memory, and the weights only once, in the model.
        checkpoint = Checkpoint.from_dict(load_checkpoint(path, mmap=True), named=str(path))
        self.encoder = checkpoint.encoder()
        self.model = checkpoint.model()
        self.calibration = checkpoint.calibration()

    def predict(self, context, model_input: pd.DataFrame, params: dict | None = None) -> list[float]:
        """The N rows' calibrated click probabilities."""

        from criteo_dlrm.engine.trained.scoring import calibrated, score_batches

        batch = typed_rows(model_input)
        [(_, logits)] = score_batches(self.model, self.encoder, [batch])
        return calibrated(self.calibration, logits).tolist()


def example_rows(parquet: str | Path, rows: int = 5) -> pd.DataFrame:
    """The first ``rows`` rows of an ingested day as raw fields: the model's input example and signature."""
    import pyarrow.parquet as pq

    # The first batch of the first row group only: reading the day whole for 5 rows held it in memory (0.7 GB for a
    # day of 2.7M rows; a Criteo 1TB day of 195M rows is 40 times that), the largest part of a run's peak.
    first = next(pq.ParquetFile(parquet).iter_batches(batch_size=rows, columns=list(FEATURE_COLUMNS)))
    table = first.slice(0, rows).to_pandas()
    frame = pd.DataFrame({name: table[name].astype("float64") for name in DENSE_COLUMNS})
    for name in SPARSE_COLUMNS:
        frame[name] = [None if pd.isna(v) else format(int(v), "08x") for v in table[name]]
    return frame


def log_checkpoint_model(checkpoint: str | Path, example: pd.DataFrame) -> str:
    """Log ``checkpoint`` (with the state folder beside it, for a sharded run's) as the active run's model (``runs:/<run id>/model``), its signature inferred from
    ``example`` and the model's predictions for it; returns the model's URI."""
    import criteo_dlrm

    checkpoint = Path(checkpoint)
    if checkpoint.with_suffix(".state").is_dir():  # a sharded run's: the file and its state folder, together
        checkpoint = checkpoint.parent
    info = mlflow.pyfunc.log_model(
        name=MODEL_NAME,
        python_model=str(Path(__file__).with_name("pyfunc_entry.py")),
        artifacts={CHECKPOINT_ARTIFACT: str(checkpoint)},
        code_paths=[str(Path(criteo_dlrm.__file__).parent)],
        signature=signature(),
        input_example=example,
        pip_requirements=_requirements(),
    )
    return info.model_uri


def signature():
    """Every Criteo field may be missing: counts as optional numbers of any numeric type (MLflow's ``double``
    would refuse an int64 column of whole numbers; ``typed_rows`` checks they are numbers), category values as
    optional hex strings; the output is one probability per row."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema
    from mlflow.types.schema import AnyType

    inputs = [ColSpec(AnyType(), name, required=False) for name in DENSE_COLUMNS]
    inputs += [ColSpec("string", name, required=False) for name in SPARSE_COLUMNS]
    return ModelSignature(inputs=Schema(inputs), outputs=Schema([ColSpec("double", "click_probability")]))


def _requirements() -> list[str]:
    from importlib.metadata import version

    return [f"{name}=={version(name)}" for name in ("torch", "numpy", "pandas", "pyarrow", "loguru", "mlflow")]
