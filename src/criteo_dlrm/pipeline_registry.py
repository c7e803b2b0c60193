"""Project pipelines."""

from __future__ import annotations

from kedro.framework.project import find_pipelines
from kedro.pipeline import Pipeline

PIPELINE_ORDER = ("ingestion", "metadata", "training", "evaluation")


def register_pipelines() -> dict[str, Pipeline]:
    """Register ``ingestion``, ``metadata``, ``training``, ``evaluation`` and ``__default__`` (all four)."""
    pipelines = find_pipelines(raise_errors=True)
    pipelines["__default__"] = sum((pipelines[name] for name in PIPELINE_ORDER if name in pipelines), Pipeline([]))
    return pipelines
