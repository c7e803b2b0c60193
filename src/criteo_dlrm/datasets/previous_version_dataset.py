"""The latest complete version of a versioned dataset, read-only, for a node that reuses what an earlier run made."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kedro.io import AbstractDataset
from kedro.io.core import DatasetError
from loguru import logger

from criteo_dlrm.common.errors import DataError

from .versioned_file import VersionedFileDataset


@dataclass(frozen=True)
class Previous:
    """What the latest version holds, and which version it is."""

    version: str
    value: Any


class PreviousVersionDataset(AbstractDataset[None, "Previous | None"]):
    """Loads the latest complete version of ``dataset`` (a versioned file dataset's own catalog entry, repeated
    here), or None when there is none or it cannot be read (said in the log): the node then makes its output
    afresh. It is never saved; the dataset itself is the node's output. Example ``catalog.yml`` entry::

        previous_feature_metadata:
          type: criteo_dlrm.datasets.PreviousVersionDataset
          dataset:
            type: criteo_dlrm.datasets.JSONDataset
            filepath: data/04_feature/feature_metadata.json
    """

    def __init__(self, dataset: dict[str, Any], lazy: bool = False, metadata: dict[str, Any] | None = None):
        self._dataset = AbstractDataset.from_config("previous", {**dataset, "versioned": True})
        if not isinstance(self._dataset, VersionedFileDataset):
            raise DatasetError(f"PreviousVersionDataset reads this project's versioned datasets, not {dataset}")
        self._lazy, self.metadata = lazy, metadata

    def load(self) -> Previous | None:
        """The latest version; with ``lazy: true`` its ``value`` is a function that reads it (None when it cannot
        be read), for a large file the node reads only when it reuses it (a checkpoint: its digest is a full
        read)."""
        version = self._dataset.loaded_version()
        if version is None:
            return None
        if self._lazy:
            return Previous(version, lambda: self._read(version))
        value = self._read(version)
        return None if value is None else Previous(version, value)

    def _read(self, version: str) -> Any:
        try:
            return self._dataset.load()
        except (DatasetError, DataError, OSError) as error:
            logger.warning("{} (its latest version, {}) cannot be reused: {}", self._dataset, version, error)
            return None

    def save(self, data: None) -> None:
        raise DatasetError("PreviousVersionDataset is read-only: its dataset's own entry saves")

    def _exists(self) -> bool:
        return True  # None when there is no version: nothing is missing

    def _describe(self) -> dict[str, Any]:
        return {"dataset": self._dataset._describe()}
