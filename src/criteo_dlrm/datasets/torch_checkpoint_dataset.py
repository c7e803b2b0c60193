"""Versioned PyTorch checkpoints, written atomically with their digest and loaded with ``weights_only=True``;
a sharded run's checkpoint is a folder: the file and the state folder it names, one version of both."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kedro.io.core import DatasetError, get_filepath_str

from criteo_dlrm.common.storage import DamagedFileError, atomic_folder, link_or_copy, reading

from .versioned_file import VersionedFileDataset

if TYPE_CHECKING:
    from criteo_dlrm.engine.trained.checkpoint import Checkpoint, StateFolder

# Checkpoints of this format on carry a digest inside (format 2 and older: the file digest beside it only).
FIRST_FORMAT_WITH_DIGEST = 3
STATE_SUFFIX = ".state"  # a sharded run's tensors: <version>/dlrm_checkpoint.state/ beside the file


class TorchCheckpointDataset(VersionedFileDataset):
    """Saves a checkpoint dict with ``torch.save``; loads it with ``weights_only=True`` onto the CPU, after
    checking its digests (a damaged or truncated file is refused, naming it, instead of scoring garbage): the
    file's, beside it, and the one inside it (``engine.trained.checkpoint.write_checkpoint``: the file's bytes before
    it, at its end), so an edited checkpoint is refused even when its file digest was written again. On a local
    filesystem the tensors are memory-mapped from the file, not read into memory (an optimiser state that nothing reads
    is never in memory).

    A sharded run's checkpoint (format 4, ``sharded_state``) names the folder its processes wrote with
    ``torch.distributed.checkpoint``: the save links that folder's files into the version
    (``<version>/<name>.state/``; hard links, copies across filesystems) before the file naming them and their
    sha256 is written; the model is read from it when it is used (``engine.trained.checkpoint.model_from_checkpoint``,
    every file checked first). Local filesystems only.

    Nodes get and give the record (``engine.trained.checkpoint.Checkpoint``); the one loaded knows the version it
    was loaded from (``version``), so a report can name it.

    Example ``catalog.yml`` entry::

        dlrm_checkpoint:
          type: criteo_dlrm.datasets.TorchCheckpointDataset
          filepath: data/06_models/dlrm_checkpoint.pt
          versioned: true
    """

    # torch and the engine are imported as a checkpoint is loaded or saved: kedro-mlflow builds every dataset of the
    # catalog at a run's start, so an import here would put torch in every run (ingestion, encoding) for nothing.

    def load(self) -> Checkpoint:
        import torch

        from criteo_dlrm.engine.trained.checkpoint import Checkpoint, content_verdict, file_verdict

        path = self._verified_path()

        def verdict() -> str | None:
            with self._fs.open(path, "rb") as handle:
                return file_verdict(handle)

        damaged = DamagedFileError(
            f"{path} is damaged: its content is not what was written (a rewrite with a new file digest beside it is "
            f"still found: the digest inside no longer matches). {self._fix()}"
        )
        checked = reading(path, verdict, self._fix())
        if checked == "damaged":  # refused before torch reads any of it
            raise damaged

        def load() -> dict[str, Any]:
            if self._protocol == "file":
                return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
            with self._fs.open(path, "rb") as handle:
                return torch.load(handle, map_location="cpu", weights_only=True)

        checkpoint = reading(path, load, self._fix())
        if not isinstance(checkpoint, dict):
            raise DamagedFileError(f"{path} is not a checkpoint written by this project. {self._fix()}")
        verdict = checked or content_verdict(checkpoint)
        if verdict == "missing" and checkpoint.get("format", 0) >= FIRST_FORMAT_WITH_DIGEST:
            raise DamagedFileError(f"{path} has lost the content digest it was written with. {self._fix()}")
        if verdict == "damaged":
            raise damaged
        record = Checkpoint.from_dict(checkpoint, version=self.loaded_version())
        if record.sharded_state is not None:
            from criteo_dlrm.engine.trained.sharded_checkpoint import check_state  # torch's DCP: 0.5 s to import

            self._local(path)
            sharded = record.sharded_state.beside(Path(path).parent)
            # Every file of the state, as the file itself is checked: a damaged version is refused here, with the
            # version's fix, and a rerun never reuses it (the model is read from them once, not checked again).
            check_state(Path(sharded.path), sharded.digests, shared=False, fix=self._fix())
            record = replace(record, sharded_state=replace(sharded, checked=True))
        return record

    def save(self, data: Checkpoint) -> None:
        from criteo_dlrm.engine.trained.checkpoint import write_checkpoint

        if data.sharded_state is not None:
            data = replace(data, sharded_state=self._store_state(data.sharded_state))
        stored = data.to_dict()
        self._write_atomically(lambda handle: write_checkpoint(stored, handle))

    def _store_state(self, sharded: StateFolder) -> StateFolder:
        """Link the state folder's files (``sharded.path``) into this version, as one folder that appears whole;
        returns what the stored file keeps (the folder's name beside it, not a path)."""
        path = Path(get_filepath_str(self._get_save_path(), self._protocol))
        self._local(str(path))
        source, folder = Path(sharded.path), path.parent / f"{path.stem}{STATE_SUFFIX}"
        with atomic_folder(folder, what=f"the checkpoint's state {folder}") as staged:
            for name in sorted(sharded.digests):
                if not (source / name).is_file():
                    raise DamagedFileError(
                        f"{source / name} is missing: the state of the run's best model is incomplete, so its "
                        f"checkpoint cannot be stored. Delete {source.parent} and train again."
                    )
                (staged / name).parent.mkdir(parents=True, exist_ok=True)
                link_or_copy(source / name, staged / name)
        return replace(sharded, folder=folder.name, path=None, checked=None)

    def _local(self, path: str) -> None:
        if self._protocol != "file":
            raise DatasetError(
                f"{path}: a sharded (TorchRec) run's checkpoint is a folder of files, stored on a local "
                "filesystem only; set dlrm_checkpoint's filepath in conf/base/catalog_training.yml to a local path "
                "(a shared filesystem mounted on every machine works)."
            )
