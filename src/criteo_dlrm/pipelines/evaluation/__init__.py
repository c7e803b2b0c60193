"""Validation metrics and plots for a checkpoint, with the vocabularies it was trained with."""

from .pipeline import create_pipeline

__all__ = ["create_pipeline"]
