"""Project pipelines, and which pipeline must run before another (for the messages that say so)."""

from __future__ import annotations

import importlib

from kedro.framework.project import find_pipelines
from kedro.pipeline import Pipeline

PIPELINE_ORDER = ("ingestion", "metadata", "training", "evaluation")
PIPELINES = (*PIPELINE_ORDER, "scoring")


def register_pipelines() -> dict[str, Pipeline]:
    """Register ``ingestion``, ``metadata``, ``training``, ``evaluation``, ``scoring`` and ``__default__``
    (the first four)."""
    pipelines = find_pipelines(raise_errors=True)
    pipelines["__default__"] = sum((pipelines[name] for name in PIPELINE_ORDER if name in pipelines), Pipeline([]))
    return pipelines


def _pipeline(name: str) -> Pipeline:
    return importlib.import_module(f"criteo_dlrm.pipelines.{name}").create_pipeline()


def producers_of(dataset: str) -> list[str]:
    """Names of the project's pipelines that output ``dataset``, in run order.

    Built from the pipeline modules, since a run loads only the pipelines it was asked for.
    """
    return [name for name in PIPELINE_ORDER if dataset in _pipeline(name).all_outputs()]


def missing_inputs(pipeline: Pipeline, catalog) -> list[str]:
    """The datasets ``pipeline`` reads that no run has written yet (parameters aside)."""
    return [
        name
        for name in sorted(pipeline.inputs())
        if not name.startswith("params:") and name not in ("parameters", "run_version") and not catalog.exists(name)
    ]


def pipelines_to_run_first(missing: list[str], catalog) -> list[str]:
    """Every pipeline, in run order, needed to produce ``missing`` and whatever those need in turn."""
    needed: set[str] = set()
    frontier = list(missing)
    while frontier:
        for producer in producers_of(frontier.pop()):
            if producer not in needed:
                needed.add(producer)
                frontier.extend(missing_inputs(_pipeline(producer), catalog))
    return [name for name in PIPELINE_ORDER if name in needed]
