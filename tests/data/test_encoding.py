import numpy as np

from criteo_dlrm.data.encoding import FeatureEncoder
from criteo_dlrm.data.metadata import MetadataSettings, compute_feature_metadata
from criteo_dlrm.data.raw import convert_day
from criteo_dlrm.data.synthetic import ClickModel, write_day


def test_days_encoded_in_parallel_give_the_same_arrays_as_one_process(tmp_path):
    days = []
    for day in range(3):
        write_day(tmp_path / f"day_{day}", 2000 + 700 * day, day=day, model=ClickModel(seed=8))
        days.append(convert_day(tmp_path / f"day_{day}", tmp_path / f"day_{day}.parquet").parquet)
    metadata, vocabularies = compute_feature_metadata(days[:1], MetadataSettings(min_frequency=2, workers=1))
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    in_memory = encoder.encode_days(days)
    one = encoder.encode_days(days, into=tmp_path / "one", workers=1)
    two = encoder.encode_days(days, into=tmp_path / "two", workers=2)
    assert len(two) == 2000 + 2700 + 3400
    for name in ("labels", "dense", "sparse"):
        expected = getattr(in_memory, name)
        assert np.array_equal(getattr(one, name), expected) and np.array_equal(getattr(two, name), expected), name
        assert (tmp_path / "one" / f"{name}.npy").read_bytes() == (tmp_path / "two" / f"{name}.npy").read_bytes()
