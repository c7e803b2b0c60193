"""Scoring new days with a trained checkpoint, and exporting it for serving."""

from .pipeline import create_pipeline

__all__ = ["create_pipeline"]
