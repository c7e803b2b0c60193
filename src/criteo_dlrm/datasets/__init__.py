"""Custom Kedro datasets (adapters: they store what the core produces)."""

from .binary_file_dataset import BinaryFileDataset
from .encoded_arrays_dataset import EncodedArraysDataset
from .feature_vocabularies_dataset import FeatureVocabulariesDataset
from .raw_day_files_dataset import RawDayFilesDataset
from .torch_checkpoint_dataset import TorchCheckpointDataset

__all__ = [
    "BinaryFileDataset",
    "EncodedArraysDataset",
    "FeatureVocabulariesDataset",
    "RawDayFilesDataset",
    "TorchCheckpointDataset",
]
