"""Digests of stored encoded rows, one per chunk of rows of each file, checked as each chunk is first read.

A folder of encoded rows (``data.stored.open_encoded``) holds ``digests.json``: the sha256 of every small file
(layout, lineage, index maxima, ``chunk_digests.npy``) and, for ``labels.npy``, ``dense.npy`` and ``sparse.npy``,
the number of rows per chunk. ``chunk_digests.npy`` holds the sha256 of each chunk of each of those files (chunk 0
includes the ``.npy`` header). Opening the rows checks the small files and the big files' sizes (milliseconds);
each chunk's digest is checked when a reader first reads its rows (``ChunkDigests.check``), so a damaged chunk
stops the run with its file's name before its rows are used, without a full read of the rows before the first
training step. A damaged chunk is recorded in ``damaged.txt``, so the next save encodes the rows again instead of
reusing them.

Folders written before chunk digests (``digests.json`` mapping every file to its digest) are checked whole when
opened, as they were.
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from criteo_dlrm.common.errors import Fix, Remedy
from criteo_dlrm.common.storage import DamagedFileError, check_digest, file_digest, reading, write_bytes_atomically

DIGESTS = "digests.json"
CHUNK_DIGESTS = "chunk_digests.npy"
DAMAGED = "damaged.txt"
# The files checked chunk by chunk, in the order of ``chunk_digests.npy``'s first axis.
CHUNKED = ("labels.npy", "dense.npy", "sparse.npy")
# Rows per digest chunk: the training loader's chunk (``data.batches.CHUNK_ROWS``), 3-7 MB of a Criteo row's
# files, so checking a chunk costs the read the loader makes anyway (then served from the page cache).
DIGEST_CHUNK_ROWS = 65_536
DIGESTS_FORMAT = 2


_ENCODE_AGAIN = Fix(pipelines="training")
# The fix for damaged encoded rows.
REENCODE = Remedy(f"Encode the rows again: `{_ENCODE_AGAIN}` (damaged encoded rows are rebuilt).", _ENCODE_AGAIN)


def _rows_layout(path: Path) -> tuple[int, int, int]:
    """(data offset, bytes per row, rows) of a ``.npy`` file, from its header."""
    mapped = np.load(path, mmap_mode="r")  # reads the header only
    row_bytes = int(mapped.dtype.itemsize * np.prod(mapped.shape[1:], dtype=np.int64))
    return int(mapped.offset), row_bytes, int(mapped.shape[0])


def _chunk_range(offset: int, row_bytes: int, rows: int, chunk_rows: int, chunk: int) -> tuple[int, int]:
    """Bytes of chunk ``chunk``: its rows, and for chunk 0 the header before them."""
    start = 0 if chunk == 0 else offset + chunk * chunk_rows * row_bytes
    return start, offset + min((chunk + 1) * chunk_rows, rows) * row_bytes


def _chunks(rows: int, chunk_rows: int) -> int:
    return max(1, -(-rows // chunk_rows))


def _read_digest(path: Path, start: int, end: int) -> bytes:
    with open(path, "rb") as handle:
        return hashlib.sha256(os.pread(handle.fileno(), end - start, start)).digest()


class WrittenChunks:
    """The digests of one file's chunks, hashed from the bytes its writer holds as it writes rows in order from
    row ``first`` on (``add``): what the writer has in memory costs no read of the file afterwards, where under a
    memory limit the rows just written are no longer in the page cache. A chunk begun before ``first``, and chunk
    0 (it holds the file's header), are left to be read (``write_chunk_digests``)."""

    def __init__(self, first: int, rows: int, chunk_rows: int | None = None):
        chunk_rows = chunk_rows or DIGEST_CHUNK_ROWS
        self.row, self.rows, self.chunk_rows = first, rows, chunk_rows
        self.hashed: dict[int, bytes] = {}
        self._hash = hashlib.sha256() if first % chunk_rows == 0 and first >= chunk_rows else None

    def add(self, data: np.ndarray) -> None:
        """The rows that follow those added so far, as stored (``EncodedArrays.as_stored``)."""
        data = np.ascontiguousarray(data)
        view, size = memoryview(data).cast("B"), data.nbytes // max(len(data), 1)
        done = 0
        while done < len(data):
            chunk, offset = divmod(self.row, self.chunk_rows)
            take = min(self.chunk_rows - offset, len(data) - done)
            if self._hash is not None:
                self._hash.update(view[done * size : (done + take) * size])
            done, self.row = done + take, self.row + take
            if self.row % self.chunk_rows == 0 or self.row == self.rows:  # the chunk is whole
                if self._hash is not None:
                    self.hashed[chunk] = self._hash.digest()
                self._hash = hashlib.sha256()


def written_digests(chunks: list[WrittenChunks]) -> dict[tuple[int, int], bytes]:
    """What ``write_chunk_digests`` takes: ``chunks`` given for each of ``CHUNKED``'s files, in its order."""
    return {(index, chunk): digest for index, written in enumerate(chunks) for chunk, digest in written.hashed.items()}


def write_chunk_digests(
    folder: Path,
    hashed: dict[tuple[int, int], bytes] | None = None,
    chunk_rows: int | None = None,
    threads: int | None = None,
) -> None:
    """Record the digest of each chunk of ``folder``'s rows (``chunk_digests.npy``), once the rows are complete:
    those the writers hashed as they wrote (``hashed``: ``(file index in CHUNKED, chunk)`` to its digest,
    ``WrittenChunks``), the others read and hashed in threads (hashlib releases the GIL), so every core reads."""
    folder, hashed, chunk_rows = Path(folder), hashed or {}, chunk_rows or DIGEST_CHUNK_ROWS
    layouts = {name: _rows_layout(folder / name) for name in CHUNKED}
    rows = {layout[2] for layout in layouts.values()}
    if len(rows) != 1:
        raise DamagedFileError(
            f"{folder}: its files hold different numbers of rows ({sorted(rows)}). {REENCODE}", fix=REENCODE
        )
    count = _chunks(rows.pop(), chunk_rows)
    digests = np.zeros((len(CHUNKED), count, 32), dtype=np.uint8)
    tasks = []
    for index, name in enumerate(CHUNKED):
        for chunk in range(count):
            if (index, chunk) in hashed:
                digests[index, chunk] = np.frombuffer(hashed[index, chunk], dtype=np.uint8)
            else:
                tasks.append((index, name, chunk))

    def digest(task: tuple[int, str, int]) -> None:
        index, name, chunk = task
        start, end = _chunk_range(*layouts[name], chunk_rows, chunk)
        digests[index, chunk] = np.frombuffer(_read_digest(folder / name, start, end), dtype=np.uint8)

    with ThreadPoolExecutor(threads or os.cpu_count() or 1) as pool:
        list(pool.map(digest, tasks))
    np.save(folder / CHUNK_DIGESTS, digests)


def write_digests(
    folder: Path, chunk_rows: int | None = None, threads: int | None = None, chunks_recorded: bool = False
) -> None:
    """Record the digests of ``folder``'s rows, chunk by chunk (``write_chunk_digests``; ``chunks_recorded``: its
    writer has recorded them, ``encode_days``), and of its other files: written last, once the rows and the
    other files are complete."""
    folder, chunk_rows = Path(folder), chunk_rows or DIGEST_CHUNK_ROWS
    if not chunks_recorded:
        write_chunk_digests(folder, chunk_rows=chunk_rows, threads=threads)
    files = {
        path.name: file_digest(path)
        for path in sorted(folder.iterdir())
        if path.is_file() and path.name not in (DIGESTS, DAMAGED, *CHUNKED)
    }
    record = {"format": DIGESTS_FORMAT, "chunk_rows": chunk_rows, "chunked": list(CHUNKED), "files": files}
    write_bytes_atomically(folder / DIGESTS, json.dumps(record, indent=1).encode())


class ChunkDigests:
    """The recorded chunk digests of one folder of rows; ``check`` verifies chunks on their first read.

    State: one flag per chunk and file (200 kB at Criteo 1TB's 4.4 billion rows); two threads checking one chunk
    at once both hash it, and agree.
    """

    def __init__(self, folder: Path, chunk_rows: int, digests: np.ndarray):
        self.folder, self.chunk_rows, self.digests = Path(folder), int(chunk_rows), digests
        self._layouts = {name: _rows_layout(self.folder / name) for name in CHUNKED}
        self._checked = np.zeros(digests.shape[:2], dtype=bool)

    def check(self, name: str, start: int, end: int) -> None:
        """Verify the chunks of ``name`` (``labels``, ``dense`` or ``sparse``) holding rows ``start:end`` that
        this process has not verified yet.

        Raises:
            DamagedFileError: naming the file, the rows of the damaged chunk and the fix.
        """
        index = CHUNKED.index(f"{name}.npy")
        first, last = start // self.chunk_rows, max(start, end - 1) // self.chunk_rows
        for chunk in range(first, min(last, self.digests.shape[1] - 1) + 1):
            if self._checked[index, chunk]:
                continue
            path = self.folder / CHUNKED[index]
            byte_range = _chunk_range(*self._layouts[CHUNKED[index]], self.chunk_rows, chunk)
            actual = reading(path, lambda path=path, byte_range=byte_range: _read_digest(path, *byte_range), REENCODE)
            if actual != self.digests[index, chunk].tobytes():
                rows = self._layouts[CHUNKED[index]][2]
                where = f"rows {chunk * self.chunk_rows:,}-{min((chunk + 1) * self.chunk_rows, rows) - 1:,}"
                message = f"{path} is damaged: {where} are not what was written (chunk {chunk} of its digests)"
                self.record_damage(message)
                raise DamagedFileError(f"{message}. It was not used. {REENCODE}", fix=REENCODE)
            self._checked[index, chunk] = True

    def check_all(self, name: str) -> None:
        self.check(name, 0, self._layouts[f"{name}.npy"][2])

    def check_again(self) -> None:
        """Verify every chunk of every file again, those verified before too (damage done since their first read:
        what a diverging run checks before blaming its learning rate)."""
        self._checked[:] = False
        for name in CHUNKED:
            self.check_all(name.removesuffix(".npy"))

    def record_damage(self, message: str) -> None:
        try:  # best effort: the run stops anyway; the record only keeps the next save from reusing these rows
            write_bytes_atomically(self.folder / DAMAGED, (message + "\n").encode())
        except OSError:
            pass


def open_digests(folder: Path) -> ChunkDigests | None:
    """Check ``folder``'s small files and big files' sizes against ``digests.json`` and return its chunk digests
    (None for a folder whose digests are recorded per file: then every file was checked whole, here).

    Raises:
        DamagedFileError: ``digests.json`` missing, a file missing or changed, damage recorded by an earlier
            read, naming the file.
    """
    folder = Path(folder)
    path = folder / DIGESTS
    if (folder / DAMAGED).exists():
        recorded = (folder / DAMAGED).read_text(errors="replace").strip()
        raise DamagedFileError(f"{recorded} (found by an earlier run). {REENCODE}", fix=REENCODE)
    if not path.exists():
        raise DamagedFileError(
            f"{path} is missing: the encoded rows in {folder} cannot be checked against what was written. {REENCODE}",
            fix=REENCODE,
        )
    record = reading(path, lambda: json.loads(path.read_text()), REENCODE)
    if record.get("format") != DIGESTS_FORMAT:  # one digest per file: check them all now
        for name, digest in record.items():
            check_digest(folder / name, digest, REENCODE)
        return None
    for name, digest in record["files"].items():
        check_digest(folder / name, digest, REENCODE)
    chunk_rows = record["chunk_rows"]
    digests = reading(folder / CHUNK_DIGESTS, lambda: np.load(folder / CHUNK_DIGESTS), REENCODE)
    for name in CHUNKED:
        if not (folder / name).exists():
            raise DamagedFileError(f"{folder / name} is missing. {REENCODE}", fix=REENCODE)
        offset, row_bytes, rows = reading(folder / name, lambda name=name: _rows_layout(folder / name), REENCODE)
        size = os.path.getsize(folder / name)
        if size != offset + rows * row_bytes or digests.shape[1] != _chunks(rows, chunk_rows):
            raise DamagedFileError(
                f"{folder / name} is damaged: {size:,} bytes where its header and digests say "
                f"{offset + rows * row_bytes:,}. {REENCODE}",
                fix=REENCODE,
            )
    return ChunkDigests(folder, chunk_rows, digests)


def verify_encoded(folder: Path) -> None:
    """Check every byte of ``folder`` against its digests now (one read of the rows, hashed in parallel)."""
    digests = open_digests(folder)
    if digests is not None:
        for name in CHUNKED:
            digests.check_all(name.removesuffix(".npy"))
