"""Encode the training and validation days, then train the DLRM."""

from .pipeline import create_pipeline

__all__ = ["create_pipeline"]
