"""Checkpoint files (atomic writes, ``weights_only`` loads), what a finished run's checkpoint records
(``training_checkpoint``), and ``Checkpoint``, the one way it is read."""

from __future__ import annotations

import hashlib
import json
import platform
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import torch

from criteo_dlrm.common.storage import DamagedFileError, atomic_file, reading
from criteo_dlrm.engine.result import TrainingResult

# 4: a sharded run's checkpoint names a folder of tensors (``sharded_state``) instead of holding ``model_state``
# and ``optimizer_state``; 3: the content digest inside (DIGEST_KEY); 2: the model's names are the YAML's
# (dense_mlp, prediction_mlp); 1: bottom_mlp, top_mlp and flat size names.
CHECKPOINT_FORMAT = 4
_FORMER_MODULES = {"bottom_mlp.": "dense_mlp.", "top_mlp.": "prediction_mlp."}


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ("torch", "numpy", "pyarrow", "pandas", "kedro", "criteo_dlrm"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def fingerprint(*parts: Any) -> str:
    """A short hash of JSON-able settings: two runs resume each other only when these agree."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def state_digest(value: Any) -> str:
    """sha256 of a checkpoint's content (every tensor's bytes, dtype and shape, and every plain value), in key
    order: the same for the same content whatever file it was loaded from."""
    digest = hashlib.sha256()

    def visit(item: Any) -> None:
        if isinstance(item, torch.Tensor):
            tensor = item.detach().cpu().contiguous()
            digest.update(f"T{tensor.dtype}{tuple(tensor.shape)}".encode())
            if tensor.numel():  # hashed in place (the buffer itself, no copy of a table of many gigabytes)
                digest.update(tensor.reshape(-1).view(torch.uint8).numpy())
        elif isinstance(item, dict):
            digest.update(f"D{len(item)}".encode())
            for key in sorted(item, key=str):
                digest.update(f"K{key!r}".encode())
                visit(item[key])
        elif isinstance(item, list | tuple):
            digest.update(f"L{len(item)}".encode())
            for element in item:
                visit(element)
        else:
            digest.update(f"V{item!r}".encode())

    visit(value)
    return digest.hexdigest()


DIGEST_KEY = "content_sha256"


def save_atomically(checkpoint: dict[str, Any], path: str | Path) -> None:
    """``torch.save`` through a staged file renamed into place, with the content's digest inside: a crash
    mid-write leaves the old file intact, and damage is found when it is loaded (``load_checkpoint``)."""
    with atomic_file(path, what=f"the checkpoint {path}") as handle:
        torch.save({**checkpoint, DIGEST_KEY: state_digest(checkpoint)}, handle)


def load_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """Load on the CPU with ``weights_only=True`` (no code runs from the file), checking the content digest
    ``save_atomically`` stored. ``mmap``: the tensors are mapped from the file, not read into memory. A file that
    names a state folder gets its ``path`` (``sharded_state_path``).

    Raises:
        DamagedFileError: the file cannot be read or its content is not what was written, naming it.
    """
    fix = "It cannot be used; delete it (a rerun then starts afresh)."
    state = reading(path, lambda: torch.load(path, map_location="cpu", weights_only=True, mmap=mmap), fix)
    if not isinstance(state, dict):
        raise DamagedFileError(f"{path} is not a checkpoint written by this project. {fix}")
    expected = state.pop(DIGEST_KEY, None)
    if expected is None:
        raise DamagedFileError(f"{path} has no content digest: it was not written by this project's save. {fix}")
    if state_digest(state) != expected:
        raise DamagedFileError(f"{path} is damaged: its content is not what was written. {fix}")
    return with_state_path(state, Path(path).parent)


def with_state_path(checkpoint: dict[str, Any], parent: Path) -> dict[str, Any]:
    """A checkpoint that names a state folder (``sharded_state``: its name beside the file, and digests), with the
    folder's ``path`` added, for ``model_from_checkpoint``; others as they are."""
    sharded = checkpoint.get("sharded_state")
    if sharded is not None and "path" not in sharded:
        checkpoint["sharded_state"] = {**sharded, "path": str(parent / sharded["folder"])}
    return checkpoint


def model_from_checkpoint(checkpoint: dict[str, Any]) -> torch.nn.Module:
    """The DLRM a checkpoint describes, with its weights (on the CPU, in eval mode)."""
    from criteo_dlrm.models import DLRM, DLRMConfig

    model = DLRM(DLRMConfig.from_dict(checkpoint["model_config"]))
    if "sharded_state" in checkpoint:
        _read_sharded_model(model, checkpoint["sharded_state"])
        return model.eval()
    state = {}
    for key, value in checkpoint["model_state"].items():
        prefix = next((old for old in _FORMER_MODULES if key.startswith(old)), None)
        state[_FORMER_MODULES[prefix] + key.removeprefix(prefix) if prefix else key] = value
    model.load_state_dict(state)
    return model.eval()


def _read_sharded_model(model: torch.nn.Module, sharded: dict[str, Any]) -> None:
    """A sharded run's weights (``model/<key>`` in its state folder, one tensor per TorchRec table) read into
    ``model``, each table straight into its rows of the torch backend's concatenated table: nothing but the model
    is allocated, and the optimiser state in the folder is never read."""
    from criteo_dlrm.common.schema import SPARSE_COLUMNS
    from criteo_dlrm.engine.sharded_checkpoint import read_alone
    from criteo_dlrm.models.torchrec_embeddings import per_table_state

    state = per_table_state(model.state_dict(), model.config, sharded.get("tables", SPARSE_COLUMNS))
    read_alone({f"model/{key}": tensor for key, tensor in state.items()}, Path(sharded["path"]), sharded["digests"])


@dataclass(frozen=True)
class Checkpoint:
    """A finished run's checkpoint (``dlrm_checkpoint``), read through one object: the model, the encoder
    (always checked against the vocabularies it was trained with), the calibration and the lineage, with the
    former formats mapped inside. Nodes make one from what the catalog loaded (``Checkpoint(dlrm_checkpoint)``);
    the dict stays the stored form (``values``)."""

    values: dict[str, Any]
    named: str | None = None  # how messages name it, where not by its catalog version (a file's path)

    @property
    def version(self) -> str | None:
        """Its catalog version (None for one not loaded from the catalog)."""
        return self.values.get("catalog_version")

    @property
    def source(self) -> str:
        """How messages name it: ``dlrm_checkpoint version <version>`` (or as it was named)."""
        return self.named or f"dlrm_checkpoint version {self.version}"

    @property
    def run_version(self) -> str | None:
        return self.values.get("run_version")

    @property
    def step(self) -> int:
        """The kept model's step."""
        return self.values["step"]

    @property
    def trained_with(self) -> dict[str, Any]:
        """The feature metadata it was trained with: ``version``, ``vocabulary_sha256``, ``train_ctr``,
        ``source_days``."""
        return self.values["metadata"]

    @property
    def metadata_version(self) -> str | None:
        """The catalog version of the feature metadata it was trained with."""
        return self.trained_with["version"]

    @property
    def source_days(self) -> dict[str, list[dict]]:
        """The days (and row ranges) it was trained, validated and tested on."""
        return self.trained_with.get("source_days") or {}

    @property
    def calibrated(self) -> bool:
        """False for a checkpoint made before calibration (it scores with its raw output)."""
        return self.values.get("calibration") is not None

    @property
    def calibration_method(self) -> str:
        return (self.values.get("calibration") or {}).get("method", "none")

    def model(self) -> torch.nn.Module:
        """Its DLRM with the kept weights, on the CPU, in eval mode."""
        return model_from_checkpoint(self.values)

    def encoder(self):
        """Its feature encoder, after checking its vocabularies are the ones it was trained with.

        Raises:
            VocabularyMismatchError (``engine.scoring``): naming it.
        """
        from criteo_dlrm.engine.scoring import checkpoint_encoder

        return checkpoint_encoder(self.values, self.source)

    def calibration(self):
        """Its calibration (an ``engine.calibration.Calibrator``, in eval mode): ``Identity`` when it has none."""
        from criteo_dlrm.engine.calibration import from_state

        return from_state(self.values.get("calibration"))


def training_checkpoint(
    result: TrainingResult,
    best: dict[str, Any],
    model_config: dict,
    parameters: dict,
    metadata: dict,
    encoder_state: dict,
    run: dict,
) -> dict[str, Any]:
    """The checkpoint of a finished run: its best weights and everything needed to resume, reproduce or score.

    Args:
        result: what ``Trainer.fit`` returned.
        best: the best model's entries (``engine.progress.load_best``): its ``model_state`` and
            ``optimizer_state``, or a sharded run's state folder (``sharded_state``), whose files the catalog's
            dataset links into the checkpoint's version.
        model_config: ``DLRMConfig.to_dict()``.
        parameters: the training parameters as run (overrides included).
        metadata: which feature metadata it was trained with (version, vocabulary sha256, train CTR, days).
        encoder_state: ``FeatureEncoder.state_dict()``, so scoring uses the exact training vocabularies.
        run: ``run_version`` and ``tensorboard_run``.
    """
    return {
        "format": CHECKPOINT_FORMAT,
        **best,
        "step": result.best_step,
        "epoch": result.best_epoch,
        "model_config": model_config,
        "training_parameters": parameters,
        "metadata": metadata,
        "encoder": encoder_state,
        "best_validation": result.best_metrics,
        "history": result.history,
        **run,
        "library_versions": library_versions(),
        "created": datetime.now(UTC).isoformat(),
    }
