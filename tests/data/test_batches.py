import itertools

import numpy as np
import pytest
import torch

from criteo_dlrm.data.batches import BatchLoader, epoch_chunks, interleave
from criteo_dlrm.data.stored import EncodedArrays


def _arrays(rows: int = 103) -> EncodedArrays:
    index = np.arange(rows)
    return EncodedArrays(
        (index % 2).astype(np.float32),
        np.repeat(index[:, None], 13, 1).astype(np.float32),
        np.repeat(index[:, None], 26, 1).astype(np.int32),
    )


def test_every_row_once_per_epoch_with_rows_kept_together():
    loader = BatchLoader(_arrays(), batch_size=10, shuffle=True, seed=4)
    batches = list(loader.batches(epoch=0))
    assert len(loader) == len(batches) == 11 and len(batches[-1]) == 3
    rows = np.concatenate([b.dense[:, 0].numpy() for b in batches]).astype(int)
    assert sorted(rows) == list(range(103))
    for batch in batches:  # label, dense and sparse of one row stay aligned
        assert (batch.sparse[:, 5].numpy() == batch.dense[:, 0].numpy()).all()
        assert (batch.labels.numpy() == batch.dense[:, 0].numpy() % 2).all()


def test_order_depends_on_seed_and_epoch_and_resumes_mid_epoch():
    loader = BatchLoader(_arrays(), batch_size=10, shuffle=True, seed=4)
    first = [b.dense[:, 0].tolist() for b in loader.batches(epoch=0)]
    second = [b.dense[:, 0].tolist() for b in loader.batches(epoch=1)]
    assert first != second
    assert [b.dense[:, 0].tolist() for b in loader.batches(epoch=0, start=7)] == first[7:]
    assert not np.array_equal(epoch_chunks(50, 1, 0), epoch_chunks(50, 2, 0))


def _rows(batches) -> list[list[int]]:
    return [b.dense[:, 0].numpy().astype(int).tolist() for b in batches]


@pytest.mark.parametrize("world_size", [2, 4, 3])
def test_processes_read_only_their_chunks_and_together_draw_one_process_s_global_batches(world_size):
    # 100,000 rows in chunks of 1,000, windows of 16 chunks (18 for 3 processes: a multiple of them).
    arrays = _arrays(100_000)
    reads = {rank: set() for rank in range(world_size)}
    loaders = [
        BatchLoader(arrays, 1000, shuffle=True, seed=7, rank=rank, world_size=world_size, chunk_rows=1000)
        for rank in range(world_size)
    ]
    per_rank = []
    for rank, loader in enumerate(loaders):
        loader.arrays = _Recording(arrays, reads[rank])
        per_rank.append(list(loader.batches(epoch=2)))
    assert len({len(batches) for batches in per_rank}) == 1 == len({len(loader) for loader in loaders})
    # Each process read whole chunks, no chunk twice, and the processes together read every chunk once.
    assert sum(len(chunks) for chunks in reads.values()) == 100 == len(set().union(*reads.values()))
    used = np.concatenate([np.concatenate(_rows(batches)) for batches in per_rank])
    assert sorted(used.tolist()) == list(range(100_000))  # every row once per epoch
    for rank, batches in enumerate(per_rank):  # a process's rows come from its own chunks only
        assert {row // 1000 for batch in _rows(batches) for row in batch} == reads[rank]
    steps = len(per_rank[0])
    globals_ = [sorted(sum((_rows(batches)[step] for batches in per_rank), [])) for step in range(steps)]
    assert all(batch.global_rows == len(globals_[i]) for batches in per_rank for i, batch in enumerate(batches))
    one = [sorted(rows) for rows in _rows(BatchLoader(arrays, 1000, shuffle=True, seed=7, chunk_rows=1000).batches(2))]
    if 16 % world_size == 0:  # the same window as one process: the same global batches, row for row
        assert globals_ == one
    else:
        assert [len(rows) for rows in globals_] == [len(rows) for rows in one]


class _Recording(EncodedArrays):
    """``arrays``, recording which chunks of 1,000 rows were checked (read) through ``check_rows``."""

    def __init__(self, arrays: EncodedArrays, chunks: set):
        super().__init__(arrays.labels, arrays.dense, arrays.sparse)
        self._chunks = chunks

    def check_rows(self, start: int, end: int) -> None:
        assert start % 1000 == 0 and end - start <= 1000, (start, end)
        assert start // 1000 not in self._chunks, f"chunk {start // 1000} read twice"
        self._chunks.add(start // 1000)


def test_each_batch_mixes_every_chunk_of_its_window_and_each_epoch_differs():
    loader = BatchLoader(_arrays(64_000), 1600, shuffle=True, seed=1, chunk_rows=1000)  # 4 windows of 16 chunks
    first, second = (_rows(loader.batches(epoch)) for epoch in (0, 1))
    for batch in first:  # 1,600 rows: 100 from each of its window's 16 chunks
        chunks = np.bincount(np.array(batch) // 1000, minlength=64)
        assert sorted(chunks[chunks > 0].tolist()) == [100] * 16
    assert [set(rows) for rows in first] != [set(rows) for rows in second]
    # Within a chunk the rows come in a new order each epoch, not file order.
    assert first[0] != sorted(first[0])


def test_the_interleave_spreads_unequal_chunks_in_proportion():
    slots, rows = interleave([4, 2])
    assert list(zip(slots.tolist(), rows.tolist(), strict=True)) == [(0, 0), (1, 0), (0, 1), (0, 2), (1, 1), (0, 3)]


def test_unshuffled_batches_follow_file_order_from_read_only_memory(tmp_path):
    arrays = _arrays(25)
    np.save(tmp_path / "dense.npy", arrays.dense)
    mapped = EncodedArrays(arrays.labels, np.load(tmp_path / "dense.npy", mmap_mode="r"), arrays.sparse)
    rows = [b.dense[:, 0].tolist() for b in BatchLoader(mapped, batch_size=10).batches()]
    assert rows == [list(map(float, range(0, 10))), list(map(float, range(10, 20))), list(map(float, range(20, 25)))]


def _slow(batches, seconds: float):
    """``batches``, each taking ``seconds`` to produce (a cold disk's gather)."""
    import time

    for batch in batches:
        time.sleep(seconds)
        yield batch


def test_prefetched_batches_are_the_loader_s_in_its_order():
    from criteo_dlrm.data.batches import Prefetcher

    loader = BatchLoader(_arrays(1000), 64, shuffle=True, seed=3)
    with Prefetcher(loader.batches(epoch=1, start=2), depth=2) as prefetched:
        got = list(prefetched)
    expected = list(loader.batches(epoch=1, start=2))
    assert len(got) == len(expected) == 14
    for mine, theirs in zip(got, expected, strict=True):
        assert torch.equal(mine.sparse, theirs.sparse) and torch.equal(mine.labels, theirs.labels)


def test_a_step_waits_for_the_larger_of_input_and_compute_not_their_sum():
    import time

    from criteo_dlrm.data.batches import Prefetcher

    loader = BatchLoader(_arrays(640), 32)  # 20 batches
    step = 0.03  # a slowed step, as slow as the input
    start = time.perf_counter()
    for _ in _slow(loader.batches(), step):
        time.sleep(step)
    serial = time.perf_counter() - start
    start = time.perf_counter()
    with Prefetcher(_slow(loader.batches(), step), depth=2) as prefetched:
        for _ in prefetched:
            time.sleep(step)
    overlapped = time.perf_counter() - start
    assert serial >= 40 * step and overlapped < 0.75 * serial, (serial, overlapped)  # max: 20 x 0.03 s + one batch


def test_an_error_while_preparing_a_batch_reaches_the_step_and_closing_early_stops_the_thread():
    from criteo_dlrm.data.batches import Prefetcher

    def failing():
        yield from BatchLoader(_arrays(100), 10).batches()
        raise OSError("the disk went away")

    with Prefetcher(failing(), depth=2) as prefetched:
        assert len(list(itertools.islice(prefetched, 10))) == 10
        with pytest.raises(OSError, match="the disk went away"):
            next(prefetched)
    endless = Prefetcher(itertools.cycle(BatchLoader(_arrays(100), 10).batches()), depth=2)
    next(endless)
    endless.close()
    assert not endless._thread.is_alive(), "stopped, not left filling a queue nobody reads"


def test_reading_ahead_reads_each_next_window_while_the_one_before_is_still_being_cut_into_batches(monkeypatch):
    """The read of window k + 1 starts while window k's batches are still being handed out: holding on to window
    k's last batch, the consumer sees it start (one window at a time, it would start only when the next batch is
    asked for, and the wait below would run out). The batches are the same as without."""
    import threading

    loader = BatchLoader(_arrays(16_000), 250, shuffle=True, seed=3, chunk_rows=500, window_chunks=4)  # 8 windows
    plain = _rows(loader.batches(epoch=1, start=3))
    window_rows, original = 2_000, BatchLoader._read_window  # 8 batches a window
    started = {begin: threading.Event() for begin in range(0, 16_000, window_rows)}

    def noted(self, chunks, start, epoch, *pool):
        started[start].set()
        return original(self, chunks, start, epoch, *pool)

    monkeypatch.setattr(BatchLoader, "_read_window", noted)
    got = []
    for position, batch in enumerate(loader.batches(epoch=1, start=3, read_ahead=True), start=3):
        got.append(batch)
        following = (position + 1) * 250
        if following % window_rows == 0 and following < 16_000:  # the last batch of its window
            assert started[following].wait(timeout=60), f"window at row {following} read only when asked for"
    assert _rows(got) == plain and all(event.is_set() for event in started.values())


def test_a_window_read_ahead_fails_on_the_batch_that_needs_it_and_an_early_stop_leaves_no_thread_behind(monkeypatch):
    import threading

    from criteo_dlrm.common.storage import DamagedFileError

    loader = BatchLoader(_arrays(8_000), 250, shuffle=True, seed=3, chunk_rows=500, window_chunks=4)  # 4 windows
    original = BatchLoader._read_window

    def damaged_third(self, chunks, start, epoch, *pool):
        if start == 4_000:
            raise DamagedFileError("window 3 is damaged")
        return original(self, chunks, start, epoch, *pool)

    monkeypatch.setattr(BatchLoader, "_read_window", damaged_third)
    batches = loader.batches(read_ahead=True)
    taken = list(itertools.islice(batches, 16))  # windows 1 and 2: the third's read has failed by now
    with pytest.raises(DamagedFileError, match="window 3"):
        next(batches)
    assert len(taken) == 16
    early = loader.batches(read_ahead=True)
    next(early)
    early.close()  # a run stopping mid-epoch (early stopping, the last step)
    assert not [t for t in threading.enumerate() if t.name.startswith("window-read-ahead")]


class _Threads(EncodedArrays):
    """``arrays``, noting the thread that checks (reads) each chunk, waiting until ``together`` threads read at
    once (so the test sees the chunks read side by side, on any machine), and refusing chunk ``damaged``."""

    def __init__(self, arrays: EncodedArrays, together: int, damaged: int | None = None):
        import threading

        super().__init__(arrays.labels, arrays.dense, arrays.sparse)
        self.names: set[str] = set()
        self.barrier = threading.Barrier(together, timeout=60)
        self.damaged, self.met = damaged, False

    def check_rows(self, start: int, end: int) -> None:
        import threading

        from criteo_dlrm.common.storage import DamagedFileError

        self.names.add(threading.current_thread().name)
        if start // 500 == self.damaged:
            raise DamagedFileError(f"rows {start}-{end - 1} are damaged")
        if not self.met:  # the first reads wait for one another; the later ones go on
            self.barrier.wait()
            self.met = True


@pytest.mark.parametrize(("world_size", "rank"), [(1, 0), (2, 1)])
def test_reading_threads_read_a_window_s_chunks_at_once_and_give_the_same_batches(world_size, rank):
    import threading

    arrays = _arrays(16_000)
    settings = {
        "shuffle": True,
        "seed": 3,
        "chunk_rows": 500,
        "window_chunks": 8,
        "rank": rank,
        "world_size": world_size,
    }
    one = _rows(BatchLoader(arrays, 250, **settings).batches(epoch=1, start=2, read_ahead=True))
    threaded = BatchLoader(_Threads(arrays, together=3), 250, reading_threads=3, **settings)
    assert _rows(threaded.batches(epoch=1, start=2, read_ahead=True)) == one
    assert _rows(threaded.batches(epoch=1, start=2)) == one  # each window read when asked for, by the threads too
    assert len({name for name in threaded.arrays.names if name.startswith("window-read_")}) == 3
    assert not [t for t in threading.enumerate() if t.name.startswith("window-read")], "the epoch's threads stopped"


def test_a_damaged_chunk_read_by_one_of_the_reading_threads_stops_the_batch_that_needs_it():
    from criteo_dlrm.common.storage import DamagedFileError

    arrays = _Threads(_arrays(8_000), together=1, damaged=9)  # chunk 9 is in the second or a later window
    loader = BatchLoader(arrays, 250, shuffle=True, seed=3, chunk_rows=500, window_chunks=4, reading_threads=2)
    with pytest.raises(DamagedFileError, match="rows 4500-4999 are damaged"):
        for _ in loader.batches(read_ahead=True):
            pass
    with pytest.raises(ValueError, match="reading_threads must be at least 1"):
        BatchLoader(arrays, 250, reading_threads=0)


def test_each_rank_s_share_of_the_batches_goes_back_in_row_order_as_arrays_or_as_tensors_where_they_are():
    """``rank_order`` undoes ``rank_share`` (23 rows, batches of 8, 3 processes: shares of 3/3/2, 3/3/2, 3/2/2);
    with NCCL the shares are gathered on the GPU and put in order there (tensors), as gloo's on the host."""
    from criteo_dlrm.data.batches import rank_order, rank_share

    rows, batch_size, world = 23, 8, 3
    values = np.arange(rows, dtype=np.float32)
    shares = [[] for _ in range(world)]
    for begin in range(0, rows, batch_size):
        for rank in range(world):
            shares[rank].append(rank_share(values[begin : begin + batch_size], world, rank))
    assert [len(part) for part in shares[2]] == [2, 2, 2] and [len(part) for part in shares[0]] == [3, 3, 3]
    arrays = [np.concatenate(share) for share in shares]
    np.testing.assert_array_equal(rank_order(arrays, rows, batch_size), values)
    ordered = rank_order([torch.from_numpy(a) for a in arrays], rows, batch_size)
    assert isinstance(ordered, torch.Tensor) and torch.equal(ordered, torch.from_numpy(values))
