"""The model: ``DLRM`` and its settings (``models.dlrm``), the parts' shapes (``models.shapes``, no torch)."""

__all__ = ["DCN", "DLRM", "DLRMConfig", "DenseMLP"]


def __getattr__(name: str):
    # Imported on first use: the settings (config.training) read models.shapes without importing torch.
    if name in __all__:
        from criteo_dlrm.models import dlrm

        return getattr(dlrm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
