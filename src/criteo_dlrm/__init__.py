"""criteo-dlrm"""

__version__ = "0.1"
