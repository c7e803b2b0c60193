"""Checkpoint files (atomic writes, ``weights_only`` loads), what a finished run's checkpoint records
(``training_checkpoint``), and ``Checkpoint``, the one way it is read."""

from __future__ import annotations

import functools
import hashlib
import io
import json
import platform
import struct
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, ClassVar

import torch

from criteo_dlrm.common.records import Record, stored, typed
from criteo_dlrm.common.storage import DamagedFileError, atomic_file, reading
from criteo_dlrm.data.source_days import SourceDays
from criteo_dlrm.engine.trained.reports import Metrics, Validation
from criteo_dlrm.engine.trained.result import TrainingResult
from criteo_dlrm.models.shapes import DLRMConfig

# 5: the digest is the file's, kept in the zip's comment at its end (``write_checkpoint``); 4: a sharded run's
# checkpoint names a folder of tensors (``sharded_state``) instead of holding ``model_state`` and ``optimizer_state``;
# 3: the content digest inside (DIGEST_KEY); 2: the model's names are the YAML's (dense_mlp, prediction_mlp); 1:
# bottom_mlp, top_mlp and flat size names.
CHECKPOINT_FORMAT = 5
_FORMER_MODULES = {"bottom_mlp.": "dense_mlp.", "top_mlp.": "prediction_mlp."}


def library_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in ("torch", "numpy", "pyarrow", "pandas", "kedro", "criteo_dlrm"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


@functools.cache
def code_identity() -> dict[str, str]:
    """The code a run trains with: the package's version and the sha256 of its installed source files (each
    ``.py`` file's path in the package and its bytes, in path order); part of a finished run's fingerprint, so a
    changed training (an upgrade, a fix) never reuses the model of the code before it."""
    import criteo_dlrm

    root = Path(criteo_dlrm.__file__).parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(f"{path.relative_to(root).as_posix()}\0".encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return {"criteo_dlrm": criteo_dlrm.__version__, "source_sha256": digest.hexdigest()}


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


# Formats 3 and 4: the content's digest (``state_digest``) inside the pickle, under this key (still read).
DIGEST_KEY = "content_sha256"
# Format 5 on: the sha256 of every byte of the file before the zip's comment length, as the zip archive's comment
# (64 hex digits, the file's last bytes), computed as ``torch.save`` writes: each tensor crosses to the host once,
# in ``torch.save`` (a content digest taken first copied every table off a GPU a second time).
_END_RECORD, _END_RECORD_SIZE = b"PK\x05\x06", 22
_COMMENT = 64
_TRAILER = 2 + _COMMENT  # the comment's length, then the comment


class _DigestTrailer(io.RawIOBase):
    """Passes ``torch.save``'s bytes to ``handle``, hashing them on the way, but for its last two (the end
    record's comment length, 0): ``finish`` writes those as 64 and the digest after them."""

    def __init__(self, handle: io.RawIOBase | io.BufferedIOBase):
        super().__init__()
        self._handle, self._digest, self._held = handle, hashlib.sha256(), b""

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        data = memoryview(data).cast("B")
        if len(data) >= 2:
            self._pass(self._held)
            self._pass(data[:-2])
            self._held = bytes(data[-2:])
        else:
            joined = self._held + bytes(data)
            self._pass(joined[:-2])
            self._held = joined[-2:]
        return len(data)

    def _pass(self, data) -> None:
        if len(data):
            self._digest.update(data)
            self._handle.write(data)

    def flush(self) -> None:
        self._handle.flush()

    def finish(self) -> None:
        if self._held != b"\x00\x00":  # torch.save's zip always ends in an empty comment's length
            raise RuntimeError(f"torch.save ended in {self._held!r}, not a zip without a comment")
        self._handle.write(struct.pack("<H", _COMMENT) + self._digest.hexdigest().encode())


def write_checkpoint(checkpoint: dict[str, Any], handle: io.RawIOBase | io.BufferedIOBase) -> None:
    """``torch.save`` to ``handle`` (one pass, nothing written back), its digest at the end (format 5)."""
    trailer = _DigestTrailer(handle)
    torch.save(checkpoint, trailer)
    trailer.finish()


def recorded_digest(handle: io.RawIOBase | io.BufferedIOBase) -> str | None:
    """The digest ``write_checkpoint`` left at the end of the open file ``handle``; None for a file without one (a
    checkpoint of format 4 or before, or a file rewritten by other means)."""
    size = handle.seek(0, io.SEEK_END)
    if size < _END_RECORD_SIZE + _COMMENT:
        return None
    handle.seek(size - _END_RECORD_SIZE - _COMMENT)
    tail = handle.read(_END_RECORD_SIZE + _COMMENT)
    if tail[:4] != _END_RECORD or tail[20:22] != struct.pack("<H", _COMMENT):
        return None
    return tail[_END_RECORD_SIZE:].decode("ascii", errors="replace")


def file_digest(handle: io.RawIOBase | io.BufferedIOBase) -> str:
    """The digest of the open file ``handle`` as ``write_checkpoint`` takes it (its bytes before the trailer), in
    pieces: memory stays at one piece whatever the file's size."""
    remaining = handle.seek(0, io.SEEK_END) - _TRAILER
    handle.seek(0)
    digest = hashlib.sha256()
    while remaining > 0 and (piece := handle.read(min(remaining, 1 << 24))):
        digest.update(piece)
        remaining -= len(piece)
    return digest.hexdigest()


def file_verdict(handle: io.RawIOBase | io.BufferedIOBase) -> str | None:
    """Whether the open checkpoint file ``handle`` is what was written, by the digest at its end (format 5 on):
    ``"intact"`` or ``"damaged"``; None for a file without one (checked by ``content_verdict`` once loaded)."""
    recorded = recorded_digest(handle)
    if recorded is None:
        return None
    return "intact" if file_digest(handle) == recorded else "damaged"


def content_verdict(state: dict[str, Any]) -> str:
    """A loaded checkpoint of format 3 or 4 by the content digest inside it (popped): ``"intact"``,
    ``"damaged"``, or ``"missing"`` when it has none."""
    inside = state.pop(DIGEST_KEY, None)
    if inside is None:
        return "missing"
    return "intact" if state_digest(state) == inside else "damaged"


def save_atomically(checkpoint: dict[str, Any], path: str | Path) -> None:
    """``torch.save`` through a staged file renamed into place, with its digest inside (``write_checkpoint``): a
    crash mid-write leaves the old file intact, and damage is found when it is loaded (``load_checkpoint``)."""
    with atomic_file(path, what=f"the checkpoint {path}") as handle:
        write_checkpoint(checkpoint, handle)


def load_checkpoint(path: str | Path, mmap: bool = False) -> dict[str, Any]:
    """Load on the CPU with ``weights_only=True`` (no code runs from the file), checking the digest
    ``save_atomically`` stored. ``mmap``: the tensors are mapped from the file, not read into memory. A file that
    names a state folder gets its ``path`` (``sharded_state_path``).

    Raises:
        DamagedFileError: the file cannot be read or its content is not what was written, naming it.
    """
    fix = "It cannot be used; delete it (a rerun then starts afresh)."

    def verdict() -> str | None:
        with open(path, "rb") as handle:
            return file_verdict(handle)

    checked = reading(path, verdict, fix)
    if checked == "damaged":
        raise DamagedFileError(f"{path} is damaged: its content is not what was written. {fix}")
    state = reading(path, lambda: torch.load(path, map_location="cpu", weights_only=True, mmap=mmap), fix)
    if not isinstance(state, dict):
        raise DamagedFileError(f"{path} is not a checkpoint written by this project. {fix}")
    verdict = checked or content_verdict(state)
    if verdict == "missing":
        raise DamagedFileError(f"{path} has no content digest: it was not written by this project's save. {fix}")
    if verdict == "damaged":
        raise DamagedFileError(f"{path} is damaged: its content is not what was written. {fix}")
    return with_state_path(state, Path(path).parent)


@dataclass(frozen=True, kw_only=True)
class StateFolder(Record):
    """A sharded run's state folder, which its checkpoint's file names: the digest of each of its files, its name
    beside the file (``folder``), the tables in it (None: the 26 of ``SPARSE_COLUMNS``); once the file that names
    it is read, where it is (``path``) and whether every file was checked already (``checked``: the catalog's load
    checks them). Stored without its unset fields."""

    OMIT_NONE = True

    digests: dict[str, str]
    folder: str | None = None
    tables: list[str] | None = None
    path: str | None = None
    checked: bool | None = None
    others: dict[str, Any] = field(default_factory=dict)

    def beside(self, parent: Path) -> StateFolder:
        """With its ``path``: the folder of its name in ``parent`` (the folder of the file that names it)."""
        return self if self.path is not None else replace(self, path=str(parent / self.folder))


@dataclass(frozen=True, kw_only=True)
class Weights(Record):
    """A model's and its optimisers' state as a checkpoint's file holds them: the tensors (``model_state``,
    ``optimizer_state``), or a sharded run's state folder (``sharded_state``) and its dense optimiser's settings
    (``dense_param_groups``). Read from a file's entries (the others are not its), written as its entries."""

    OMIT_NONE = True

    model_state: dict[str, torch.Tensor] | None = None
    optimizer_state: dict[str, Any] | None = None
    sharded_state: StateFolder | None = None
    dense_param_groups: list[dict[str, Any]] | None = None

    @property
    def sharded(self) -> bool:
        return self.sharded_state is not None

    def beside(self, parent: Path) -> Weights:
        """A sharded run's, with its state folder's ``path`` (``parent``: the folder of the file); others as they are."""
        return replace(self, sharded_state=self.sharded_state.beside(parent)) if self.sharded else self


def with_state_path(checkpoint: dict[str, Any], parent: Path) -> dict[str, Any]:
    """A checkpoint's entries, its state folder's (a sharded run's) with the folder's ``path`` added, for
    ``model_from_checkpoint``; others as they are."""
    weights = Weights.from_dict(checkpoint)
    return {**checkpoint, **weights.beside(parent).to_dict()} if weights.sharded else checkpoint


def model_from_checkpoint(checkpoint: dict[str, Any]) -> torch.nn.Module:
    """The DLRM a stored checkpoint (a dict, of any format) describes, with its weights (on the CPU, in eval mode)."""
    return model_with_weights(DLRMConfig.from_dict(checkpoint["model_config"]), Weights.from_dict(checkpoint))


def model_with_weights(config: DLRMConfig, weights: Weights) -> torch.nn.Module:
    """The DLRM of ``config`` with its weights (on the CPU, in eval mode): ``model_state`` (former module names
    mapped), or a sharded run's state folder."""
    from criteo_dlrm.models import DLRM

    model = DLRM(config)
    if weights.sharded:
        _read_sharded_model(model, weights.sharded_state)
        return model.eval()
    state = {}
    for key, value in weights.model_state.items():
        prefix = next((old for old in _FORMER_MODULES if key.startswith(old)), None)
        state[_FORMER_MODULES[prefix] + key.removeprefix(prefix) if prefix else key] = value
    model.load_state_dict(state)
    return model.eval()


def _read_sharded_model(model: torch.nn.Module, sharded: StateFolder) -> None:
    """A sharded run's weights (``model/<key>`` in its state folder, one tensor per TorchRec table) read into
    ``model``, each table straight into its rows of the torch backend's concatenated table: nothing but the model
    is allocated, and the optimiser state in the folder is never read."""
    from criteo_dlrm.common.schema import SPARSE_COLUMNS
    from criteo_dlrm.engine.trained.sharded_checkpoint import read_alone
    from criteo_dlrm.models.torchrec_embeddings import per_table_state

    state = per_table_state(model.state_dict(), model.config, sharded.tables or SPARSE_COLUMNS)
    tensors = {f"model/{key}": tensor for key, tensor in state.items()}
    read_alone(tensors, Path(sharded.path), sharded.digests, checked=bool(sharded.checked))


@dataclass(frozen=True, kw_only=True)
class TrainedWith(Record):
    """The feature metadata a checkpoint was trained with (stored as its ``metadata``): its catalog version, the
    vocabularies' digest, the training rows' click rate and the days it was trained, validated and tested on."""

    version: str | None = None
    vocabulary_sha256: str | None = None
    train_ctr: float | None = None
    source_days: SourceDays | None = None
    others: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Checkpoint:
    """A finished run's checkpoint (``dlrm_checkpoint``): the kept model's weights (or a sharded run's state folder)
    and everything needed to resume, reproduce or score it, read through its methods: the model, the encoder
    (always checked against the vocabularies it was trained with) and the calibration.

    Built complete by ``training_checkpoint``; ``from_dict``/``to_dict`` convert the stored form (the dict the
    catalog's ``TorchCheckpointDataset`` saves and loads), with the former formats mapped in ``model()``.

    Attributes:
        step, epoch: the kept model's.
        model_config: the DLRM's sizes (stored as ``DLRMConfig.to_dict()``; read from any format).
        trained_with: the feature metadata it was trained with: ``version``, ``vocabulary_sha256``,
            ``train_ctr``, ``source_days`` (stored as ``metadata``).
        encoder_state: ``FeatureEncoder.state_dict()`` (stored as ``encoder``).
        calibration_state: the fitted calibrator's state (``engine.trained.calibration``; stored as ``calibration``),
            None for a checkpoint made before calibration.
        model_state, optimizer_state: its tensors; or ``sharded_state``: a sharded run's state folder, with its
            dense optimiser's ``dense_param_groups``.
        code: the code that trained it (``code_identity``); ``fingerprint``: its finished run's (settings, rows
            and code), read from here, under the content digest, when a rerun decides to reuse it.
        version: its catalog version (the dataset adds it on load; not stored); ``named``: how messages name it
            otherwise (a file's path; not stored).
        others: stored keys this version does not know, kept as they are.
    """

    step: int
    model_config: DLRMConfig
    trained_with: TrainedWith
    encoder_state: dict[str, Any]
    calibration_state: dict[str, Any] | None = None
    model_state: dict[str, torch.Tensor] | None = None
    optimizer_state: dict[str, Any] | None = None
    sharded_state: StateFolder | None = None
    dense_param_groups: list[dict[str, Any]] | None = None
    epoch: int | None = None
    training_parameters: dict[str, Any] = field(default_factory=dict)
    best_validation: Metrics | None = None
    history: list[Validation] = field(default_factory=list)
    run_version: str | None = None
    tensorboard_run: str | None = None
    library_versions: dict[str, str] = field(default_factory=dict)
    code: dict[str, str] | None = None
    fingerprint: str | None = None
    created: str | None = None
    format: int = CHECKPOINT_FORMAT
    version: str | None = None
    named: str | None = None
    others: dict[str, Any] = field(default_factory=dict)

    # Stored keys whose field has another name; ``version`` and ``named`` are not stored.
    _STORED_AS: ClassVar[dict[str, str]] = {
        "trained_with": "metadata", "encoder_state": "encoder", "calibration_state": "calibration",
    }  # fmt: skip
    _NOT_STORED: ClassVar[tuple[str, ...]] = ("version", "named", "others")

    @classmethod
    def from_dict(cls, values: dict[str, Any], named: str | None = None, version: str | None = None) -> Checkpoint:
        """A stored checkpoint (``version``: the catalog's it was loaded from)."""
        names = {f.name for f in fields(cls)} - set(cls._NOT_STORED)
        stored = {cls._STORED_AS.get(name, name): name for name in names}
        known = {stored[key]: value for key, value in values.items() if key in stored}
        others = {key: value for key, value in values.items() if key not in stored}
        if (model_config := known.pop("model_config", None)) is not None:
            known["model_config"] = DLRMConfig.from_dict(model_config)
        return cls(**typed(cls, known), version=version, named=named, others=others)

    def to_dict(self) -> dict[str, Any]:
        """The stored form: what ``save_atomically`` and the catalog's dataset write (absent entries left out)."""
        names = [f.name for f in fields(self) if f.name not in self._NOT_STORED]
        values = {self._STORED_AS.get(name, name): value for name, value in stored(self, names).items()}
        values["model_config"] = self.model_config.to_dict()
        optional = ("model_state", "optimizer_state", "sharded_state", "dense_param_groups")
        return {key: value for key, value in values.items() if not (key in optional and value is None)} | self.others

    @property
    def source(self) -> str:
        """How messages name it: ``dlrm_checkpoint version <version>`` (or as it was named)."""
        return self.named or f"dlrm_checkpoint version {self.version}"

    @property
    def metadata_version(self) -> str | None:
        """The catalog version of the feature metadata it was trained with."""
        return self.trained_with.version

    @property
    def vocabulary_sha256(self) -> str | None:
        """The digest of the vocabularies it was trained with."""
        return self.trained_with.vocabulary_sha256

    @property
    def train_ctr(self) -> float | None:
        """The click rate of the rows it was trained on (the prior it is compared with)."""
        return self.trained_with.train_ctr

    @property
    def source_days(self) -> SourceDays:
        """The days (and row ranges) it was trained, validated and tested on."""
        return self.trained_with.source_days or SourceDays()

    @property
    def calibrated(self) -> bool:
        """False for a checkpoint made before calibration (it scores with its raw output)."""
        return self.calibration_state is not None

    @property
    def calibration_method(self) -> str:
        return (self.calibration_state or {}).get("method", "none")

    def model(self) -> torch.nn.Module:
        """Its DLRM with the kept weights, on the CPU, in eval mode."""
        return model_with_weights(self.model_config, self.weights)

    @property
    def weights(self) -> Weights:
        """Its kept model's and optimisers' state."""
        return Weights(model_state=self.model_state, optimizer_state=self.optimizer_state,
                       sharded_state=self.sharded_state, dense_param_groups=self.dense_param_groups)  # fmt: skip

    def encoder(self):
        """Its feature encoder, after checking its vocabularies are the ones it was trained with.

        Raises:
            VocabularyMismatchError (``engine.trained.scoring``): naming it.
        """
        from criteo_dlrm.engine.trained.scoring import checked_encoder

        return checked_encoder(self.encoder_state, self.vocabulary_sha256, self.source)

    def calibration(self):
        """Its calibration (an ``engine.trained.calibration.Calibrator``, in eval mode): ``Identity`` when it has
        none."""
        from criteo_dlrm.engine.trained.calibration import from_state

        return from_state(self.calibration_state)


def training_checkpoint(
    result: TrainingResult,
    best: Weights,
    model_config: DLRMConfig,
    parameters: dict,
    trained_with: TrainedWith,
    encoder_state: dict,
    calibration: dict,
    run: dict,
    finished: str | None = None,
) -> Checkpoint:
    """The checkpoint of a finished run: its best weights and everything needed to resume, reproduce or score.

    Args:
        result: what ``Trainer.fit`` returned.
        best: the best model's entries (``engine.training.run_state.load_best``): its ``model_state`` and
            ``optimizer_state``, or a sharded run's state folder (``sharded_state``), whose files the catalog's
            dataset links into the checkpoint's version.
        model_config: the DLRM's sizes.
        parameters: the training parameters as run (overrides included).
        trained_with: which feature metadata it was trained with (version, vocabulary sha256, train CTR, days).
        encoder_state: ``FeatureEncoder.state_dict()``, so scoring uses the exact training vocabularies.
        calibration: the calibrator fitted on the kept model's validation logits (its state).
        run: ``run_version`` and ``tensorboard_run``.
        finished: the finished run's fingerprint (``engine.training.recipe``), kept under the content digest.
    """
    return Checkpoint(
        model_state=best.model_state,
        optimizer_state=best.optimizer_state,
        sharded_state=best.sharded_state,
        dense_param_groups=best.dense_param_groups,
        step=result.best_step,
        epoch=result.best_epoch,
        model_config=model_config,
        training_parameters=parameters,
        trained_with=trained_with,
        encoder_state=encoder_state,
        calibration_state=calibration,
        best_validation=result.best_metrics,
        history=result.history,
        **run,
        library_versions=library_versions(),
        code=code_identity(),
        fingerprint=finished,
        created=datetime.now(UTC).isoformat(),
    )
