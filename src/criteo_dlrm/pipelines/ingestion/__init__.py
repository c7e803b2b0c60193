"""Raw Criteo TSV day files into typed Parquet."""

from .pipeline import create_pipeline

__all__ = ["create_pipeline"]
