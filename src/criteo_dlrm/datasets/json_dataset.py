"""JSON files (reports, metrics, metadata), versioned or not, written atomically with their digest."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kedro.utils import load_obj

from criteo_dlrm.common.storage import DamagedFileError

from .previews import JSONPreview
from .versioned_file import VersionedFileDataset

CONTENT_KEY = "content_sha256"


def content_sha256(data: dict) -> str:
    """sha256 of a mapping's content (its ``content_sha256`` aside), keys sorted: the same however it is laid out."""
    rest = {key: value for key, value in data.items() if key != CONTENT_KEY}
    return hashlib.sha256(json.dumps(rest, sort_keys=True, allow_nan=True).encode()).hexdigest()


class JSONDataset(VersionedFileDataset):
    """Saves any JSON-able value (indented, so a report reads well); loads it back, digest checked.

    Unlike ``kedro_datasets.json.JSONDataset`` nothing is written in place: a full disk or a kill mid-save
    never leaves a truncated newest version. Example ``catalog.yml`` entry::

        evaluation_metrics:
          type: criteo_dlrm.datasets.JSONDataset
          filepath: data/08_reporting/evaluation_metrics.json
          versioned: true
    """

    def __init__(self, *args, content_digest: bool = False, record: str | None = None, **kwargs):
        """``content_digest``: a mapping is stored with the sha256 of its content inside (``content_sha256``),
        checked when it is loaded, so an edit is found even when the file's ``.sha256`` was written again.
        ``record``: the class (``module.Class``) whose ``from_dict`` reads what is loaded and whose ``to_dict``
        writes what is saved (e.g. ``criteo_dlrm.engine.trained.reports.EvaluationReport``): nodes get and give
        the record. Imported when the dataset is first loaded or saved, not when the catalog is built."""
        super().__init__(*args, **kwargs)
        self._content_digest, self._record = content_digest, record

    def load(self) -> Any:
        data = self._read(lambda handle: json.loads(handle.read()))
        if self._content_digest and isinstance(data, dict) and CONTENT_KEY in data:
            recorded = data.pop(CONTENT_KEY)
            if recorded != content_sha256(data):
                raise DamagedFileError(
                    f"{self._load_path()} is damaged: its content is not what was written (an edit with a new file "
                    f"digest beside it is still found: the content digest inside no longer matches). {self._fix()}"
                )
        return self._record_class().from_dict(data) if self._record else data

    def _record_class(self) -> type:
        return load_obj(self._record)

    def save(self, data: Any) -> None:
        if self._record and isinstance(data, self._record_class()):
            data = data.to_dict()
        if self._content_digest and isinstance(data, dict):
            data = {**{k: v for k, v in data.items() if k != CONTENT_KEY}, CONTENT_KEY: content_sha256(data)}
        text = json.dumps(data, indent=1, allow_nan=True) + "\n"
        self._write_atomically(lambda handle: handle.write(text.encode()))

    def preview(self) -> JSONPreview:
        """What kedro viz shows: the whole document."""
        data = self.load()
        return JSONPreview(json.dumps(data.to_dict() if self._record else data))
