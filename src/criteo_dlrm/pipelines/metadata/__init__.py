"""Per-feature counts, vocabularies and dense statistics from the training days."""

from .pipeline import create_pipeline

__all__ = ["create_pipeline"]
