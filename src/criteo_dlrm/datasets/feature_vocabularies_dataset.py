"""Versioned vocabularies in one ``.npz`` (one int64 array per sparse feature)."""

from __future__ import annotations

import zipfile

import numpy as np

from criteo_dlrm.common.storage import DamagedFileError
from criteo_dlrm.data.feature_metadata import FeatureVocabularies

from .versioned_file import VersionedFileDataset


class FeatureVocabulariesDataset(VersionedFileDataset):
    """Saves ``{feature: values}``; loads a ``FeatureVocabularies`` that knows its own catalog version.

    Example ``catalog.yml`` entry::

        feature_vocabularies:
          type: criteo_dlrm.datasets.FeatureVocabulariesDataset
          filepath: data/04_feature/feature_vocabularies.npz
          versioned: true
    """

    def load(self) -> FeatureVocabularies:
        path = self._load_path()

        def read(handle) -> dict[str, np.ndarray]:
            try:
                with np.load(handle, allow_pickle=False) as arrays:
                    loaded = {name: arrays[name] for name in arrays.files}
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as error:
                # Object arrays need pickle, which could run code: never loaded (numpy refuses them here).
                raise DamagedFileError(
                    f"{path} is not vocabularies this project wrote ({error}): it was not loaded. {self._fix()}"
                ) from error
            wrong = [name for name, values in loaded.items() if values.dtype != np.int64 or values.ndim != 1]
            if wrong:
                raise DamagedFileError(
                    f"{path} holds {', '.join(wrong[:3])} as other than one int64 array each: not vocabularies "
                    f"this project wrote. {self._fix()}"
                )
            return loaded

        return FeatureVocabularies(arrays=self._read(read), version=self.loaded_version())

    def save(self, data: FeatureVocabularies | dict[str, np.ndarray]) -> None:
        arrays = data.arrays if isinstance(data, FeatureVocabularies) else data
        self._write_atomically(
            lambda handle: np.savez(handle, **{k: np.asarray(v, dtype=np.int64) for k, v in arrays.items()})
        )
