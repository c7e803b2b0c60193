"""Versioned vocabularies in one ``.npz`` (one int64 array per sparse feature)."""

from __future__ import annotations

import numpy as np

from criteo_dlrm.data.metadata import FeatureVocabularies

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
        def read(handle) -> dict[str, np.ndarray]:
            with np.load(handle, allow_pickle=False) as arrays:
                return {name: arrays[name] for name in arrays.files}

        return FeatureVocabularies(arrays=self._read(read), version=self.loaded_version())

    def save(self, data: FeatureVocabularies | dict[str, np.ndarray]) -> None:
        arrays = data.arrays if isinstance(data, FeatureVocabularies) else data
        self._write_atomically(
            lambda handle: np.savez(handle, **{k: np.asarray(v, dtype=np.int64) for k, v in arrays.items()})
        )
