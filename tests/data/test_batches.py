import itertools

import numpy as np
import pytest
import torch

from criteo_dlrm.data.batches import BatchLoader, epoch_order
from criteo_dlrm.data.encoding import EncodedArrays


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
    assert not np.array_equal(epoch_order(50, 1, 0), epoch_order(50, 2, 0))


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
