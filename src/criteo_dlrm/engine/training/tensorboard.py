"""Metric logging: a small protocol, and its TensorBoard implementation."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams as hparams_summary


class MetricLogger(Protocol):
    def log_scalars(self, scalars: dict[str, float], step: int) -> None: ...

    def log_hparams(self, hparams: dict, metrics: dict[str, float], step: int = 0) -> None: ...

    def close(self) -> None: ...


# The kept model's validation metrics, in the scalars tab and the HPARAMS tab: sorted after train/ and validation/.
KEPT = "validation_kept"


class TensorBoardLogger:
    """Writes scalars and hparams into one TensorBoard run folder.

    ``purge_step``: a resumed run drops the events its interrupted self wrote from that step on, so the
    curves continue from the in-progress checkpoint without a doubled stretch.
    """

    def __init__(self, run_dir: str | Path, purge_step: int | None = None):
        self.run_dir = Path(run_dir)
        self.writer = SummaryWriter(log_dir=str(self.run_dir), purge_step=purge_step)

    def log_scalars(self, scalars: dict[str, float], step: int) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)

    def log_hparams(self, hparams: dict, metrics: dict[str, float], step: int = 0) -> None:
        """The run's settings with the kept model's metrics (``metrics``, at its ``step``) for the HPARAMS tab.

        The metrics go under ``KEPT/<name>`` at the kept step, after the real curves in the scalars tab
        (``add_hparams`` would put one-point ``hparams/...`` cards ahead of them).
        """
        # TensorBoard's hparams take scalars and strings only.
        flat = {k: v if isinstance(v, int | float | str | bool) else str(v) for k, v in hparams.items()}
        tags = {f"{KEPT}/{name}": value for name, value in metrics.items()}
        writer = self.writer._get_file_writer()
        for summary in hparams_summary(flat, tags):
            writer.add_summary(summary)
        for tag, value in tags.items():
            self.writer.add_scalar(tag, value, step)

    def close(self) -> None:
        self.writer.close()


class NullLogger:
    """Discards everything (benchmarks, notebooks)."""

    def log_scalars(self, scalars: dict[str, float], step: int) -> None:
        pass

    def log_hparams(self, hparams: dict, metrics: dict[str, float], step: int = 0) -> None:
        pass

    def close(self) -> None:
        pass


def flat_hparams(values: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists become strings (TensorBoard's hparams take scalars only)."""
    flat = {}
    for key, value in values.items():
        if isinstance(value, dict):
            flat.update(flat_hparams(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = str(value) if isinstance(value, list | tuple) or value is None else value
    return flat
