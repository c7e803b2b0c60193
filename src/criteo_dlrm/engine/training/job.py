"""What a training process is given (a ``TrainingJob``) and what it hands back (a ``TrainingOutcome``), and the
files they travel in between processes and machines.

Neither file can carry code: the job is JSON, the outcome a ``torch.save`` of tensors and plain values
loaded with ``weights_only=True``. A file planted in a shared folder is refused, never run.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, fields
from pathlib import Path

from criteo_dlrm.common.errors import ConfigError, DataError
from criteo_dlrm.common.storage import DamagedFileError, write_bytes_atomically
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.data.stored import EncodedArrays, open_encoded
from criteo_dlrm.engine.trained.checkpoint import load_checkpoint, save_atomically
from criteo_dlrm.engine.trained.result import TrainingResult

JOB_FORMAT = 1


@dataclass
class TrainingJob:
    """Everything a training process needs: the configuration and the folders of the stored rows."""

    config: TrainingConfig  # a dict (``to_dict``) in the job file, parsed again (and checked) when it is loaded
    # Folders of stored rows (``data.stored.open_encoded``), or rows in memory for a run in this process only.
    train: str | EncodedArrays
    validation: str | EncodedArrays
    table_sizes: list[int]
    fingerprint: str
    run_version: str
    initial_ctr: float | None = None  # the training rows' click rate: where the model's output starts

    @property
    def run_dir(self) -> Path:
        return Path(self.config.tensorboard_dir) / self.run_version

    @property
    def resume_path(self) -> Path | None:
        if not self.config.resume:
            return None
        return Path(self.config.in_progress_dir) / f"dlrm_{self.fingerprint}.pt"

    @property
    def best_path(self) -> Path:
        """Where the best model is written while the run trains (``engine.training.run_state``), resume on or off."""
        return Path(self.config.in_progress_dir) / "best" / f"dlrm_{self.fingerprint}.pt"

    def rows(self, split: str) -> EncodedArrays:
        """The training (``train``) or validation rows, memory-mapped when stored."""
        source = getattr(self, split)
        return open_encoded(Path(source)) if isinstance(source, str) else source

    def save(self, path: Path) -> None:
        if not (isinstance(self.train, str) and isinstance(self.validation, str)):
            raise ValueError(
                "a job file names stored rows: store rows held in memory first (data.stored.write_encoded)"
            )
        values = {**_shallow(self), "config": self.config.to_dict()}
        write_bytes_atomically(path, json.dumps({"format": JOB_FORMAT, **values}, indent=1).encode())

    @classmethod
    def load(cls, path: str | Path) -> TrainingJob:
        """Raises ``DataError`` naming ``path`` when it is not a job file this project wrote."""
        try:
            values = json.loads(Path(path).read_text())
            if values.pop("format") != JOB_FORMAT:
                raise ValueError("another format")
            values["config"] = TrainingConfig.from_dict(values["config"], "training.")
            return cls(**values)
        except ConfigError:
            raise
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as error:
            raise DataError(
                f"{path} is not a training job file of this project ({error}). Start the run again with "
                "`kedro run`, which writes it."
            ) from error


@dataclass
class TrainingOutcome:
    result: TrainingResult
    run_dir: str
    device: str
    backends: dict
    processes: int
    embeddings: dict  # where the tables lived: the backend, and TorchRec's plan

    def save(self, path: Path) -> None:
        """Rank 0 hands its outcome to the launching process through a file (the best weights stay in theirs)."""
        save_atomically({**_shallow(self), "result": self.result.to_dict(), "pid": os.getpid()}, path)

    @classmethod
    def load(cls, path: str | Path) -> TrainingOutcome:
        try:
            values = load_checkpoint(path)
            values.pop("pid", None)
            values["result"] = TrainingResult.from_dict(values["result"])
            return cls(**values)
        except DamagedFileError:
            raise
        except (TypeError, KeyError) as error:
            raise DataError(f"{path} is not a training outcome of this project ({error}).") from error


def _shallow(instance) -> dict:
    """A dataclass's fields as a dict, without copying them (``asdict`` would deep-copy every tensor)."""
    return {field.name: getattr(instance, field.name) for field in fields(instance)}
