"""The raw Criteo day files of a folder, as a read-only dataset (the pipeline's ``raw`` layer)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kedro.io import AbstractDataset, DatasetError
from kedro_datasets._typing import JSONPreview  # the preview types kedro-viz renders

from criteo_dlrm.data.raw import find_day_files


class RawDayFilesDataset(AbstractDataset[None, list[str]]):
    """Loads the paths of the day files in ``path`` (``day_<N>``, ``day_<N>.gz``, ``*.txt``, ``*.tsv``), in day order.

    The files themselves are streamed by ingestion, never loaded whole. Example ``catalog.yml`` entry::

        raw_day_files:
          type: criteo_dlrm.datasets.RawDayFilesDataset
          path: ${runtime_params:ingestion.raw_dir,data/01_raw}
    """

    def __init__(self, path: str, metadata: dict[str, Any] | None = None):
        self._path = Path(path)
        self.metadata = metadata

    def load(self) -> list[str]:
        return [str(p) for p in find_day_files(self._path)]

    def save(self, data: None) -> None:
        raise DatasetError(f"{self._path} holds raw input: it is read, never written.")

    def _exists(self) -> bool:
        try:
            return bool(find_day_files(self._path))
        except ValueError:
            return False

    def _describe(self) -> dict[str, Any]:
        return {"path": str(self._path)}

    def preview(self) -> JSONPreview:
        """What kedro viz shows: the folder and its day files with their sizes."""
        files = find_day_files(self._path) if self._exists() else []
        sizes = {p.name: f"{p.stat().st_size / 1e6:.1f} MB" for p in files}
        return JSONPreview(json.dumps({"folder": str(self._path), "files": sizes}))
