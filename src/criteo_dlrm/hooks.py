"""Cross-cutting project hooks: loguru into Kedro's logging, unknown parameter names refused, a clear
message when inputs are missing, and the run's catalog version handed to nodes that name output
folders after it."""

from __future__ import annotations

import importlib
import logging
from pathlib import Path, PurePosixPath

from kedro.framework.hooks import hook_impl
from loguru import logger

from criteo_dlrm.common.errors import UserError
from criteo_dlrm.parameters import check_parameters, load_schema
from criteo_dlrm.pipeline_registry import PIPELINE_ORDER

RUN_VERSION = "run_version"
# What the current (or last) run wrote, summarised by ``run_summary`` for ``kedro run`` to print at the end.
_saved: dict[str, object] = {}
_SUMMARISED = (
    "ingestion_report", "feature_metadata", "training_summary", "validation_metrics", "scoring_report", "export_report"
)  # fmt: skip


class _PropagateHandler(logging.Handler):
    """Hands loguru records to the standard logger of the same module name, which Kedro configures."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger(record.name).handle(record)


class MissingInputError(UserError, RuntimeError):
    """A pipeline was asked to run before the pipeline that produces its inputs."""


class MissingVersionError(UserError, LookupError):
    """``--load-versions`` pinned a version that was never written."""


def existing_versions(dataset) -> list[str]:
    """The versions a versioned file dataset holds (its version folders), oldest first."""
    filepath, fs = getattr(dataset, "_filepath", None), getattr(dataset, "_fs", None)
    if filepath is None or fs is None or not fs.exists(str(filepath)):
        return []
    return sorted(PurePosixPath(path).name for path in fs.ls(str(filepath), detail=False))


def _missing_version_message(name: str, version: str, dataset) -> str:
    versions = existing_versions(dataset)
    where = getattr(dataset, "_filepath", name)
    if not versions:
        return f"{name} version {version} does not exist: no run has written {name} yet (nothing in {where})."
    shown = ", ".join(versions[-10:])
    more = f" (the last 10 of {len(versions)})" if len(versions) > 10 else ""
    return (
        f"{name} version {version} does not exist. The versions in {where}{more}, oldest first: {shown}. "
        f"Pin one of them with --load-versions={name}:<version>, or leave {name} out for the newest."
    )


def bridge_loguru() -> None:
    """Route loguru through ``logging`` so ``conf/logging.yml`` decides where our messages go."""
    logger.remove()
    logger.add(_PropagateHandler(), format="{message}", level="DEBUG")


def _pipeline(name: str):
    return importlib.import_module(f"criteo_dlrm.pipelines.{name}").create_pipeline()


def producers_of(dataset: str) -> list[str]:
    """Names of the project's pipelines that output ``dataset``, in run order.

    Built from the pipeline modules, since a run loads only the pipelines it was asked for.
    """
    return [name for name in PIPELINE_ORDER if dataset in _pipeline(name).all_outputs()]


def _missing_inputs(pipeline, catalog) -> list[str]:
    return [
        name
        for name in sorted(pipeline.inputs())
        if not name.startswith("params:") and name not in ("parameters", RUN_VERSION) and not catalog.exists(name)
    ]


def pipelines_to_run_first(missing: list[str], catalog) -> list[str]:
    """Every pipeline, in run order, needed to produce ``missing`` and whatever those need in turn."""
    needed: set[str] = set()
    frontier = list(missing)
    while frontier:
        for producer in producers_of(frontier.pop()):
            if producer not in needed:
                needed.add(producer)
                frontier.extend(_missing_inputs(_pipeline(producer), catalog))
    return [name for name in PIPELINE_ORDER if name in needed]


def run_summary() -> str:
    """The last run's outputs and final metrics as one block of short lines ('' when it saved nothing)."""
    lines = []
    if report := _saved.get("ingestion_report"):
        days = report["days"]
        lines.append(
            f"ingestion   {len(days)} days, {sum(d['rows'] for d in days):,} rows, "
            f"{sum(d['rejected'] for d in days):,} rejected"
        )
    if metadata := _saved.get("feature_metadata"):
        tables = [stats["table_size"] for stats in metadata["sparse"].values()]
        lines.append(
            f"metadata    {metadata['label']['rows']:,} training rows, CTR {metadata['label']['ctr']:.4f}, "
            f"{sum(tables):,} embedding rows"
        )
    if summary := _saved.get("training_summary"):
        stop = "stopped early" if summary["stopped_early"] else "ran every step"
        lines.append(
            f"training    {summary['steps']:,} steps ({stop}), kept step {summary['best_step']:,}, "
            f"{summary['samples_per_second']:,.0f} samples/s"
        )
    if metrics := _saved.get("validation_metrics"):
        model = metrics["model"]
        lines.append(
            f"evaluation  {', '.join(metrics['days'])}: AUC {model['auc']:.4f}, log loss {model['log_loss']:.5f}, "
            f"NE {model['normalized_entropy']:.4f}, calibration {model['calibration']:.3f}"
        )
        lines.append(f"            prior log loss {metrics['prior_baseline']['log_loss']:.5f}")
        if metrics["oracle"]:
            lines[-1] += f"; oracle AUC {metrics['oracle']['auc']:.4f}, log loss {metrics['oracle']['log_loss']:.5f}"
    if report := _saved.get("scoring_report"):
        line = f"scoring     {report['rows']:,} rows of {report['input_dir']}, mean prediction {report['mean_prediction'] or 0:.4f}"
        if report["metrics"]:
            line += f", AUC {report['metrics']['auc']:.4f}"
        lines.append(line)
    if export := _saved.get("export_report"):
        lines.append(
            f"export      ONNX {export['onnx_bytes'] / 1e6:.1f} MB (onnxruntime max |difference| "
            f"{export['onnx_check']['max_abs_difference']:.1e}), torch.export {export['exported_program_bytes'] / 1e6:.1f} MB"
        )
    if not lines:
        return ""
    version = _saved.get(RUN_VERSION)
    return "\n".join([f"Run {version}:", *(f"  {line}" for line in lines)])


class ProjectHooks:
    def __init__(self) -> None:
        self._schema: dict | None = None

    @hook_impl
    def after_context_created(self, context) -> None:
        bridge_loguru()
        self._schema = load_schema(Path(context.config_loader.conf_source) / "base")

    @hook_impl
    def after_catalog_created(self, catalog, parameters: dict, save_version: str) -> None:
        if self._schema is not None:
            # ``parameters`` is Kedro's feed dict: the nested tree is its "parameters" entry.
            check_parameters(parameters["parameters"], self._schema)
        # Training names its TensorBoard folder after this, so the folder matches the checkpoint version.
        catalog[RUN_VERSION] = save_version
        _saved.clear()
        _saved[RUN_VERSION] = save_version

    @hook_impl
    def after_dataset_saved(self, dataset_name: str, data) -> None:
        if dataset_name in _SUMMARISED:
            _saved[dataset_name] = data

    @hook_impl
    def before_pipeline_run(self, run_params, pipeline, catalog) -> None:
        # Raw inputs (no pipeline makes them) report their own problem when loaded.
        missing = [name for name in _missing_inputs(pipeline, catalog) if producers_of(name)]
        if not missing:
            return
        pinned = run_params.get("load_versions") or {}
        wrong_versions = [_missing_version_message(n, pinned[n], catalog.get(n)) for n in missing if n in pinned]
        if wrong_versions:
            raise MissingVersionError("\n".join(wrong_versions))
        first = pipelines_to_run_first(missing, catalog)
        command = f"kedro run --pipelines={','.join(first)}" if first else "kedro run"
        raise MissingInputError(
            f"This run needs {', '.join(missing)}, which no earlier run has written. "
            f"Run `{command}` first, or `kedro run` for the whole job."
        )
