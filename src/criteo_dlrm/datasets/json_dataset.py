"""JSON files (reports, metrics, metadata), versioned or not, written atomically with their digest."""

from __future__ import annotations

import json
from typing import Any

from .previews import JSONPreview
from .versioned_file import VersionedFileDataset


class JSONDataset(VersionedFileDataset):
    """Saves any JSON-able value (indented, so a report reads well); loads it back, digest checked.

    Unlike ``kedro_datasets.json.JSONDataset`` nothing is written in place: a full disk or a kill mid-save
    never leaves a truncated newest version. Example ``catalog.yml`` entry::

        evaluation_metrics:
          type: criteo_dlrm.datasets.JSONDataset
          filepath: data/08_reporting/evaluation_metrics.json
          versioned: true
    """

    def load(self) -> Any:
        return self._read(lambda handle: json.loads(handle.read()))

    def save(self, data: Any) -> None:
        text = json.dumps(data, indent=1, allow_nan=True) + "\n"
        self._write_atomically(lambda handle: handle.write(text.encode()))

    def preview(self) -> JSONPreview:
        """What kedro viz shows: the whole document."""
        return JSONPreview(json.dumps(self.load()))
