"""The model: ``DLRM`` (``models.dlrm``, torch) and its settings (``models.shapes``: ``DLRMConfig``, the parts'
shapes and the interactions' size rules, no torch)."""

from criteo_dlrm.models.shapes import DCN, DenseMLP, DLRMConfig

__all__ = ["DCN", "DLRM", "DLRMConfig", "DenseMLP"]


def __getattr__(name: str):
    # Imported on first use: the settings (config.training) read models.shapes without importing torch.
    if name == "DLRM":
        from criteo_dlrm.models.dlrm import DLRM

        return DLRM
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
