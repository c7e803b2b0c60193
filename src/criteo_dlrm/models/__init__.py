from .dlrm import DCN, DLRM, DenseMLP, DLRMConfig

__all__ = ["DCN", "DLRM", "DLRMConfig", "DenseMLP"]
