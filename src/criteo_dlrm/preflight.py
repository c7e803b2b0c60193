"""Everything a run can know is wrong before its first node runs, refused at once with the fix.

Parameters (every pipeline's, typed), the day names the metadata block refers to, the devices the run asks
for, the TorchRec extra and optimiser, whether the metadata and vocabularies a run would train with belong
together, and whether the embedding tables fit in memory. Outputs of runs that were killed (versions never
completed) are named, with how to remove them.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from kedro.io.core import Version
from kedro.pipeline import Node, Pipeline
from loguru import logger

from criteo_dlrm.common.errors import Fix, UserError
from criteo_dlrm.common.schema import SPARSE_COLUMNS
from criteo_dlrm.common.storage import check_free_space, check_writable, process_alive
from criteo_dlrm.config import Config, IngestionConfig, MetadataConfig, TrainingConfig
from criteo_dlrm.config.metadata import check_day_names
from criteo_dlrm.data.feature_metadata import FeatureMetadata
from criteo_dlrm.data.metadata import MismatchedVersionsError
from criteo_dlrm.data.raw import day_name, find_scoring_input, scan_raw_folder
from criteo_dlrm.data.source_days import SourceDay, SourceDays
from criteo_dlrm.datasets.encoded_arrays_dataset import EncodedArraysDataset
from criteo_dlrm.datasets.versioned_file import RUN_TOKEN, VersionedFileDataset
from criteo_dlrm.pipelines.evaluation.nodes import evaluate_checkpoint
from criteo_dlrm.pipelines.ingestion.nodes import convert_raw_days
from criteo_dlrm.pipelines.metadata.nodes import compute_metadata
from criteo_dlrm.pipelines.scoring.nodes import export_model, score_new_days
from criteo_dlrm.pipelines.training.nodes import encode_features, train_dlrm


def _nodes(pipeline: Pipeline) -> set:
    """The node functions ``pipeline`` runs: checks are keyed on them, so a renamed node keeps its checks (and
    a renamed function fails at import, not silently)."""
    return {node.func for node in pipeline.nodes}


def preprocesses(pipeline: Pipeline) -> bool:
    """Whether ``pipeline`` runs a preprocessing stage (the ones ``preprocessing.engine`` chooses where to run)."""
    return bool({convert_raw_days, compute_metadata, encode_features} & _nodes(pipeline))


def _dataset(catalog, name: str):
    try:
        return catalog.get(name)
    except (KeyError, ValueError):
        return None


def _output_folders(configs: dict[str, Config], pipeline: Pipeline, catalog) -> dict[Path, tuple[str, str]]:
    """``{folder: (what, setting)}`` for every local folder the run writes: its outputs' and its settings'."""
    nodes, folders = _nodes(pipeline), {}
    for name in sorted(pipeline.all_outputs()):
        dataset = _dataset(catalog, name)
        if isinstance(dataset, VersionedFileDataset) and (folder := dataset.local_folder()) is not None:
            folders[folder] = (name, f"{name}'s filepath (conf/*/catalog_*.yml)")
        elif isinstance(dataset, EncodedArraysDataset):
            folders[dataset.path.parent] = (name, f"{name}'s path (conf/*/catalog_*.yml)")
    settings = {
        convert_raw_days: [("ingestion", "output_dir", "the Parquet days")],
        train_dlrm: [("training", "in_progress_dir", "the in-progress checkpoint"),
                     ("training", "tensorboard_dir", "TensorBoard's run folder")],
        score_new_days: [("scoring", "parquet_dir", "the scoring input's Parquet days")],
    }  # fmt: skip
    for node, entries in settings.items():
        if node in nodes:
            for block, field, what in entries:
                folders[Path(getattr(configs[block], field))] = (what, f"{block}.{field}")
    return folders


def check_before_run(configs: dict[str, Config], pipeline: Pipeline, catalog) -> None:
    """Raise the first problem a run of ``pipeline`` would meet that can be known before it starts."""
    nodes = _nodes(pipeline)
    for folder, (what, setting) in _output_folders(configs, pipeline, catalog).items():
        check_writable(folder, what, setting)
    if compute_metadata in nodes:
        _check_day_names(configs["ingestion"], configs["metadata"], convert_raw_days in nodes, catalog)
    if train_dlrm in nodes:  # encoding alone needs none of these: its workers hold a chunk each, not the tables
        _check_training(configs["training"], configs["metadata"], compute_metadata in nodes, catalog)
    if evaluate_checkpoint in nodes:
        from criteo_dlrm.engine.device import resolve_device  # torch: a run that ingests or encodes needs none

        resolve_device(configs["evaluation"].device, "evaluation.device")
    if {score_new_days, export_model} & nodes:
        from criteo_dlrm.engine.device import resolve_device

        resolve_device(configs["scoring"].device, "scoring.device")
    if score_new_days in nodes:
        _check_scoring_space(configs["scoring"], *find_scoring_input(configs["scoring"].input_dir), catalog)


# Lower bounds, so that no run that fits is refused: a scored row's prediction takes at least its float32
# probability, and a raw Criteo line at most 1 kB (they are 150-300 bytes; compressed files are counted as they are).
PREDICTION_BYTES_AT_LEAST = 4
RAW_LINE_BYTES_AT_MOST = 1000


def _check_scoring_space(config, raw_days: list[Path], parquet_days: list[Path], catalog) -> None:
    """Refuse a scoring run whose predictions cannot fit where they are staged (``scoring.parquet_dir``) or
    stored (the ``predictions`` dataset's folder), before the export or any scoring runs."""
    import pyarrow.parquet as pq

    if parquet_days:
        rows = sum(pq.read_metadata(path).num_rows for path in parquet_days)
    else:
        rows = sum(path.stat().st_size for path in raw_days) // RAW_LINE_BYTES_AT_MOST
    needed = rows * PREDICTION_BYTES_AT_LEAST
    what = f"the predictions of {rows:,} rows or more"
    folders = {Path(config.parquet_dir): f"{what} (staged there by scoring.parquet_dir)"}
    dataset = _dataset(catalog, "predictions")
    if isinstance(dataset, VersionedFileDataset) and (folder := dataset.local_folder()) is not None:
        folders.setdefault(folder, what)
    for folder, described in folders.items():
        check_free_space(folder, needed, described)


def _check_day_names(ingestion: IngestionConfig, metadata: MetadataConfig, ingests: bool, catalog) -> None:
    """The day names the metadata block refers to exist, and the split they make (explicit or default) gives
    every day one role at most: refused before ingestion when the raw folder's names tell."""
    if ingests:
        if ingestion.rows_per_day:
            return  # the split days' names (<file>_0000, ...) are known once the files are split
        raw = scan_raw_folder(ingestion.raw_dir)
        names, where = [day_name(path) for path in raw.days], f"the days of {raw.folder}"
    elif catalog.exists("ingestion_report"):
        names, where = [day.day for day in catalog.load("ingestion_report").days], "the ingested days"
    else:
        return
    check_day_names(metadata, names, where)
    metadata.split(names)


def _check_training(config: TrainingConfig, metadata: MetadataConfig, computes_metadata: bool, catalog) -> None:
    # The engine (torch) is imported by the runs that train, not by those that ingest, count or encode.
    from criteo_dlrm.engine.device import check_process_count, resolve_device
    from criteo_dlrm.engine.memory import check_lookup_memory
    from criteo_dlrm.engine.parallel.modes import placement_class

    device = resolve_device(config.device, "training.device")
    check_process_count(config.distributed.nproc_per_node, device)
    placement_class(config).check(config, device)
    # The tables first, where their sizes are known: they hold a batch's lookups' rows many times over, and their
    # refusal names what shrinks them (an embedding dimension of 1e9 was refused as too many lookups a row).
    _check_known_tables(config, metadata, computes_metadata, catalog, device)
    check_lookup_memory(config, device)  # the table sizes are not needed for it: every run, before any node


def _rows(days: list[SourceDay]) -> int:
    return sum(int(day.rows or 0) for day in days)


def _check_known_tables(
    config: TrainingConfig, metadata: MetadataConfig, computes_metadata: bool, catalog, device
) -> None:
    """The tables' memory, where their sizes are known before any node runs: set by the modulus hash, or held by
    the existing metadata version this run's training reads. Tables this run counts are checked once counted
    (``check_counted_tables``)."""
    from criteo_dlrm.engine.memory import TABLE_SETTINGS, check_table_memory

    if computes_metadata:
        if metadata.use_modulus_hash and metadata.modulus_hash_size:  # sizes set, not counted: known now
            sizes = [metadata.modulus_hash_size] * len(SPARSE_COLUMNS)
            check_table_memory(config, sizes, device, "metadata.modulus_hash_size, " + TABLE_SETTINGS)
        return
    metadata_set = [_dataset(catalog, name) for name in ("feature_metadata", "feature_vocabularies")]
    if not all(isinstance(ds, VersionedFileDataset) and ds.exists() for ds in metadata_set):
        return  # missing inputs are reported by the hook with the pipelines to run first
    check_same_run(*metadata_set)
    version = metadata_set[0].loaded_version()
    # Tables too large in an existing metadata version are shrunk by computing metadata again, not by settings
    # this run's training reads.
    counted: FeatureMetadata = catalog.load("feature_metadata")
    days = counted.source_days or SourceDays()
    check_table_memory(
        config,
        counted.table_sizes,
        device,
        f"feature_metadata version {version} holds these tables: run the metadata pipeline again with this "
        "run's training (--pipelines=metadata,training) and a smaller metadata.max_vocabulary_size, "
        "metadata.modulus_hash_size or a larger metadata.min_frequency; or smaller training.sparse_embedding_sizes",
        validation_rows=_rows(days.validation),
        train_rows=_rows(days.train),
    )


def counts_its_own_tables(configs: dict[str, Config], pipeline: Pipeline) -> bool:
    """Whether ``pipeline`` trains on tables its own metadata stage counts (their sizes unknown before it runs):
    their memory is then checked once counted, before encoding (``check_counted_tables``)."""
    metadata = configs["metadata"]
    if metadata.use_modulus_hash and metadata.modulus_hash_size:
        return False  # checked before the run (``_check_known_tables``)
    return {compute_metadata, encode_features, train_dlrm} <= _nodes(pipeline)


def check_counted_tables(configs: dict[str, Config], node: Node, inputs: dict) -> None:
    """Before ``encode_features`` runs: the memory of the tables this run's metadata stage counted, before they are
    encoded and trained on."""
    if node.func is not encode_features:
        return
    from criteo_dlrm.engine.device import resolve_device
    from criteo_dlrm.engine.memory import check_table_memory

    config = configs["training"]
    counted: FeatureMetadata = inputs["feature_metadata"]
    days = counted.source_days or SourceDays()
    check_table_memory(
        config,
        counted.table_sizes,
        resolve_device(config.device, "training.device"),
        validation_rows=_rows(days.validation),
        train_rows=_rows(days.train),
    )


def check_same_run(metadata: VersionedFileDataset, vocabularies: VersionedFileDataset) -> None:
    """``feature_metadata`` and ``feature_vocabularies`` are saved together: their versions must be one."""
    first, second = metadata.loaded_version(), vocabularies.loaded_version()
    if first != second:
        fix = Fix(pipelines="training", load_versions={"feature_metadata": first, "feature_vocabularies": first})
        raise MismatchedVersionsError(
            f"feature_metadata version {first} and feature_vocabularies version {second} were written by different "
            f"runs: vocabularies must be the ones their metadata counted. Pin both to one version: `{fix}`.",
            fix=fix,
        )


def _in_progress(owner: dict) -> bool:
    """Whether the run an ``.incomplete`` marker names may still be running: this process, or another live
    process on this host (a pid alone repeats: one equal to this process's, with another token, is a dead run's)."""
    if owner.get("token") == RUN_TOKEN:
        return True
    pid = int(owner.get("pid", 0) or 0)
    return owner.get("host") == socket.gethostname() and pid != os.getpid() and process_alive(pid)


def report_incomplete_versions(catalog, names: list[str]) -> None:
    """Log the versions that killed runs left incomplete (they are never loaded), with how to remove them."""
    stale = []
    for name in names:
        dataset = _dataset(catalog, name)
        if not isinstance(dataset, VersionedFileDataset):
            continue
        for folder, owner in dataset.incomplete_versions().items():
            if _in_progress(owner):
                continue
            stale.append(folder)
    if stale:
        logger.warning(
            "{} output version(s) of runs that did not finish are ignored (never loaded): {}. Remove them with: "
            "rm -r {}",
            len(stale), ", ".join(stale), " ".join(f"'{Path(folder)}'" for folder in stale),
        )  # fmt: skip


class FutureVersionError(UserError, LookupError):
    """The newest version of an input is dated after this run began: not this run's, and not one it can order."""


def pin_versions(catalog, pipeline: Pipeline, run_version: str, pinned: dict[str, str]) -> None:
    """Fix, once the run has begun, which version each versioned dataset is read at: an output of this run at the
    version this run writes (a later node never reads another run's, saved meanwhile or dated later), an input at
    the newest version now (one another run completes while this one runs is not read).

    Raises:
        FutureVersionError: an input's newest version is dated after this run began (a clock set back, or
            versions copied from a machine whose clock is ahead): naming it and the pin that reads it anyway.
    """
    outputs = pipeline.all_outputs()
    for name in sorted(outputs | pipeline.inputs()):
        dataset = _dataset(catalog, name)
        if not isinstance(dataset, VersionedFileDataset) or not dataset._version:
            continue
        save = dataset._version.save
        if name in outputs:
            dataset._version = Version(dataset.resolve_save_version(), save)
            continue
        if name in pinned:
            continue
        latest = dataset.loaded_version()
        if latest is None:
            continue
        if latest > run_version:
            fix = Fix(load_versions={name: latest})
            raise FutureVersionError(
                f"{name}'s newest version, {latest}, is dated after this run began ({run_version}): the clock was "
                "set back, or the version was copied from a machine whose clock is ahead, so which version is the "
                f"newest cannot be told by its name. Pin the version to read: `{fix}`.",
                fix=fix,
            )
        dataset._version = Version(latest, save)
