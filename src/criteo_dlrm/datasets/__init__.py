"""Custom Kedro datasets (adapters: they store what the core produces)."""

from .binary_file_dataset import BinaryFileDataset
from .encoded_arrays_dataset import EncodedArraysDataset
from .feature_vocabularies_dataset import FeatureVocabulariesDataset
from .figure_dataset import FigureDataset
from .json_dataset import JSONDataset
from .previous_version_dataset import Previous, PreviousVersionDataset
from .torch_checkpoint_dataset import TorchCheckpointDataset

__all__ = [
    "BinaryFileDataset",
    "EncodedArraysDataset",
    "FeatureVocabulariesDataset",
    "FigureDataset",
    "JSONDataset",
    "Previous",
    "PreviousVersionDataset",
    "TorchCheckpointDataset",
]
