"""A sharded run's state on disk with ``torch.distributed.checkpoint`` (DCP): every process writes its own
shards, in parallel, and nothing is gathered; loading reshards, so a run written by N processes resumes in M.

A state is a flat dict of tensors (``ShardedTensor`` for TorchRec's tables and their fused optimiser state; plain
tensors, written once by the lowest rank, for what every process holds alike). Its folder is written under a
staging name and renamed once every process has written and hashed its files, so a half-written folder is never
read; the sha256 of every file is recorded (``write_state`` returns them) and checked before a load, so a damaged
shard is refused with its name.

DCP's own reader unpickles its ``.metadata`` file with plain ``pickle.load`` and loads non-tensor entries with
``torch.load(weights_only=False)``: a planted folder could run code. Here ``.metadata`` is read by an unpickler
that knows only DCP's metadata classes (no bytes entries), and states hold tensors only: nothing in a folder can
run code when it is loaded.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta, TensorStorageMetadata

from criteo_dlrm.common.storage import DamagedFileError, disk_full_error, file_digest, is_disk_full, sync_folder

METADATA = ".metadata"
# What DCP's metadata pickles: its dataclasses, sizes, dtypes and layouts. No BytesStorageMetadata: a state of
# tensors has no bytes entry, and a bytes entry is what DCP would load with torch.load(weights_only=False).
_ALLOWED = {
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    *(
        ("torch.distributed.checkpoint.metadata", name)
        for name in (
            "Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
            "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING",
        )
    ),
}  # fmt: skip


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED or (module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a checkpoint's metadata")


class SafeReader(FileSystemReader):
    """DCP's file reader, with ``.metadata`` read by ``_MetadataUnpickler`` (tensors are read with
    ``weights_only=True`` by DCP itself)."""

    def read_metadata(self, *args, **kwargs) -> Metadata:
        path = Path(self.path) / METADATA
        try:
            metadata = _MetadataUnpickler(io.BytesIO(path.read_bytes())).load()
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, TypeError) as error:
            raise DamagedFileError(
                f"{path} is not the metadata of a checkpoint this project wrote ({error}): it was not loaded. "
                "Delete its folder; a rerun then starts afresh."
            ) from error
        if not isinstance(metadata, Metadata):
            raise DamagedFileError(f"{path} is not the metadata of a checkpoint this project wrote.")
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def _rank_world() -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)


# A state is written as parts of about this many bytes (whole tensors, in key order), one ``dcp.save`` each:
# DCP's file writer keeps every tensor it wrote to a file until the file is done, as a copy where the tensor is a
# view (TorchRec's tables are views of one buffer per kernel), so one part at a time bounds that copy by a part,
# or the largest table, instead of the whole state (measured: +1.0x the tables and their state at every write).
PART_BYTES = 256 * 2**20
PART = "part-{:04d}"


def _parts(state: dict[str, torch.Tensor]) -> list[list[str]]:
    """``state``'s keys in parts of about ``PART_BYTES`` (the tensors' whole sizes: the same in every process)."""
    parts, current, size = [], [], 0
    for key in sorted(state):
        tensor = state[key]
        current.append(key)
        size += math.prod(tensor.size()) * torch.empty(0, dtype=tensor.dtype).element_size()  # a ShardedTensor's too
        if size >= PART_BYTES:
            parts.append(current)
            current, size = [], 0
    return [*parts, current] if current or not parts else parts


def _part_folders(folder: Path) -> list[Path]:
    """The parts of a state folder, in order (a folder written in one part by an earlier version: itself)."""
    return [folder] if (folder / METADATA).exists() else sorted(folder.glob("part-*"))


def write_state(state: dict[str, torch.Tensor], folder: Path) -> dict[str, str] | None:
    """Write ``state`` to ``folder`` from every process (each its own shards), then rename it into place.

    Every process of the group calls it. Returns ``{file path in the folder: sha256}`` on rank 0 (None on the
    others): each process hashes the files it wrote; rank 0 gathers the digests and renames the folder.
    """
    rank, world = _rank_world()
    staging = folder.with_name(f".{folder.name}.partial")
    if rank == 0:
        shutil.rmtree(staging, ignore_errors=True)  # left by a killed run
        staging.mkdir(parents=True)
    if world > 1:
        dist.barrier()
    mine = {}
    for index, keys in enumerate(_parts(state)):
        part = staging / PART.format(index)
        try:
            dcp.save({key: state[key] for key in keys}, storage_writer=dcp.FileSystemWriter(part, sync_files=True))
        except (CheckpointException, OSError) as error:  # DCP's exception is a BaseException, every rank's traceback
            if not is_disk_full(error):
                raise
            if rank == 0:
                shutil.rmtree(staging, ignore_errors=True)
            raise disk_full_error(
                folder.parent, f"the training state of step {folder.name.rsplit('-', 1)[-1]}"
            ) from error
        mine.update(
            {
                f"{part.name}/{path.name}": file_digest(path)
                for path in sorted(part.iterdir())
                if path.name.startswith(f"__{rank}_") or (rank == 0 and path.name == METADATA)
            }
        )
    gathered = [None] * world if rank == 0 else None
    if world > 1:
        dist.gather_object(mine, gathered, dst=0)
    else:
        gathered = [mine]
    digests = None
    if rank == 0:
        digests = {name: digest for part in gathered for name, digest in part.items()}
        shutil.rmtree(folder, ignore_errors=True)  # the same step written again (a resumed run's last save)
        os.replace(staging, folder)
        sync_folder(folder.parent)
    if world > 1:
        dist.barrier()  # nobody reads or replaces the folder before it is in place
    return digests


def _first_problem(folder: Path, names: list[str], digests: dict[str, str]) -> str:
    for name in names:
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        if file_digest(path) != digests[name]:
            return f"{path} is damaged: its content is not what was written"
    return ""


def check_state(folder: Path, digests: dict[str, str], shared: bool = True, fix: str | None = None) -> None:
    """Every file of ``folder`` against ``digests``; ``shared``: the processes of the group share the hashing
    (every one must call it).

    Raises:
        DamagedFileError: in every process, naming the first file that is missing or damaged, and ``fix`` (by
            default: delete the folder, as for a run's own state, which a rerun then makes afresh).
    """
    rank, world = _rank_world() if shared else (0, 1)
    problem = _first_problem(folder, sorted(digests)[rank::world], digests)
    if world > 1:
        problems = [None] * world
        dist.all_gather_object(problems, problem)
        problem = next((p for p in problems if p), "")
    if problem:
        raise DamagedFileError(
            f"{problem}. {fix or f'It cannot be used; delete {folder} (a rerun then starts afresh).'}"
        )


def read_state(
    state: dict[str, torch.Tensor], folder: Path, digests: dict[str, str], allocate: str | None = None
) -> dict[str, torch.Tensor]:
    """Load ``folder`` into ``state``'s tensors in place (every process its own shards, resharded from however
    many processes wrote it), after checking its files; the saved tensors whose key starts with ``allocate``
    (state that does not exist before it is loaded, as an optimiser's) are made here, loaded and returned."""
    check_state(folder, digests)
    made = {}
    for part in _part_folders(folder):
        shapes = _shapes(part)
        mine = {key: torch.empty(size, dtype=dtype) for key, (size, dtype) in shapes.items()
                if allocate is not None and key.startswith(allocate)}  # fmt: skip
        dcp.load({**{key: state[key] for key in shapes if key in state}, **mine}, storage_reader=SafeReader(part))
        made.update(mine)
    return made


def _shapes(part: Path) -> dict[str, tuple[torch.Size, torch.dtype]]:
    metadata = SafeReader(part).read_metadata()
    return {
        key: (entry.size, entry.properties.dtype)
        for key, entry in metadata.state_dict_metadata.items()
        if isinstance(entry, TensorStorageMetadata)
    }


def saved_shapes(folder: Path) -> dict[str, tuple[torch.Size, torch.dtype]]:
    """Every tensor of the state in ``folder``, by key: its whole size and dtype (from the metadata)."""
    return {key: shape for part in _part_folders(folder) for key, shape in _shapes(part).items()}


def read_alone(state: dict[str, torch.Tensor], folder: Path, digests: dict[str, str], checked: bool = False) -> None:
    """Load the saved tensors ``state`` names into its tensors (views too), in this process alone (no process
    group), after checking every file of ``folder`` (unless ``checked``: the catalog's dataset checked them as it
    loaded the checkpoint): how a finished sharded run's model is read for evaluation, scoring and export (its
    tables straight into the torch backend's concatenated ones)."""
    if not checked:
        check_state(folder, digests, shared=False)
    with warnings.catch_warnings():  # DCP says it loads in one process, which is what no_dist asks of it
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        warnings.filterwarnings("ignore", message="Please use DTensor instead", category=FutureWarning)
        for part in _part_folders(folder):
            wanted = {key: state[key] for key in _shapes(part) if key in state}
            if wanted:
                dcp.load(wanted, storage_reader=SafeReader(part), no_dist=True)


def consolidate(folder: Path, digests: dict[str, str], prefix: str = "") -> dict[str, torch.Tensor]:
    """The state's tensors whose key starts with ``prefix``, whole, in this process alone (tests, inspection)."""
    target = {
        key: torch.empty(size, dtype=dtype)
        for key, (size, dtype) in saved_shapes(folder).items()
        if key.startswith(prefix)
    }
    read_alone(target, folder, digests)
    return target
