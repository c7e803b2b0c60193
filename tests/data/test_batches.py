import numpy as np

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
