from .dlrm import DLRM, DLRMConfig

__all__ = ["DLRM", "DLRMConfig"]
