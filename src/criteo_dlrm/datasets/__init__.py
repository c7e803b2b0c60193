"""Custom Kedro datasets (adapters: they store what the core produces)."""

from .encoded_arrays_dataset import EncodedArraysDataset
from .feature_vocabularies_dataset import FeatureVocabulariesDataset
from .torch_checkpoint_dataset import TorchCheckpointDataset

__all__ = ["EncodedArraysDataset", "FeatureVocabulariesDataset", "TorchCheckpointDataset"]
