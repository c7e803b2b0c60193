"""Metric logging: a small protocol, and its TensorBoard implementation."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from torch.utils.tensorboard import SummaryWriter


class MetricLogger(Protocol):
    def log_scalars(self, scalars: dict[str, float], step: int) -> None: ...

    def log_hparams(self, hparams: dict, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


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

    def log_hparams(self, hparams: dict, metrics: dict[str, float]) -> None:
        # TensorBoard's hparams take scalars and strings only.
        flat = {k: v if isinstance(v, int | float | str | bool) else str(v) for k, v in hparams.items()}
        self.writer.add_hparams(flat, {f"hparams/{k}": v for k, v in metrics.items()}, run_name=".")

    def close(self) -> None:
        self.writer.close()


class NullLogger:
    """Discards everything (benchmarks, notebooks)."""

    def log_scalars(self, scalars: dict[str, float], step: int) -> None:
        pass

    def log_hparams(self, hparams: dict, metrics: dict[str, float]) -> None:
        pass

    def close(self) -> None:
        pass
