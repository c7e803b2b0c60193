"""Custom Kedro datasets (adapters: they store what the core produces).

Each is imported when first named (the catalog names them as ``criteo_dlrm.datasets.<Class>``): a ``kedro``
command that reads no checkpoint never imports torch for it."""

_MODULES = {
    "BinaryFileDataset": "binary_file_dataset",
    "EncodedArraysDataset": "encoded_arrays_dataset",
    "FeatureVocabulariesDataset": "feature_vocabularies_dataset",
    "FigureDataset": "figure_dataset",
    "JSONDataset": "json_dataset",
    "Previous": "previous_version_dataset",
    "PreviousVersionDataset": "previous_version_dataset",
    "TorchCheckpointDataset": "torch_checkpoint_dataset",
}
__all__ = sorted(_MODULES)


def __getattr__(name: str):
    if name in _MODULES:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_MODULES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
