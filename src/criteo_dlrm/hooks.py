"""Cross-cutting project hooks: loguru into Kedro's logging, a clear message when inputs are missing,
and the run's catalog version handed to nodes that name output folders after it."""

from __future__ import annotations

import logging

from kedro.framework.hooks import hook_impl
from kedro.framework.project import pipelines as registered_pipelines
from loguru import logger

RUN_VERSION = "run_version"


class _PropagateHandler(logging.Handler):
    """Hands loguru records to the standard logger of the same module name, which Kedro configures."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger(record.name).handle(record)


class MissingInputError(RuntimeError):
    """A pipeline was asked to run before the pipeline that produces its inputs."""


def bridge_loguru() -> None:
    """Route loguru through ``logging`` so ``conf/logging.yml`` decides where our messages go."""
    logger.remove()
    logger.add(_PropagateHandler(), format="{message}", level="DEBUG")


def producers_of(dataset: str) -> list[str]:
    """Names of the registered pipelines (other than ``__default__``) that output ``dataset``."""
    return sorted(name for name, pipeline in registered_pipelines.items() if name != "__default__" and dataset in pipeline.all_outputs())


class ProjectHooks:
    @hook_impl
    def after_context_created(self, context) -> None:
        bridge_loguru()

    @hook_impl
    def after_catalog_created(self, catalog, save_version: str) -> None:
        # Training names its TensorBoard folder after this, so the folder matches the checkpoint version.
        catalog[RUN_VERSION] = save_version

    @hook_impl
    def before_pipeline_run(self, run_params, pipeline, catalog) -> None:
        missing = [
            name
            for name in sorted(pipeline.inputs())
            if not name.startswith("params:") and name not in ("parameters", RUN_VERSION) and not catalog.exists(name)
        ]
        if not missing:
            return
        lines = []
        for name in missing:
            producers = producers_of(name)
            command = f"kedro run --pipelines={','.join(producers)}" if producers else "kedro run"
            lines.append(f"  {name}: produced by `{command}`")
        raise MissingInputError(
            "This run needs datasets that no earlier run has written:\n"
            + "\n".join(lines)
            + "\nRun those pipelines first, or `kedro run` for the whole job."
        )
