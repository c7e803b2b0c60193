import gzip

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from criteo_dlrm.data.synthetic import VOCABULARY_SIZES, ClickModel, read_probabilities, write_day, write_days
from tests.conftest import naive_parse_line


def test_same_seed_writes_identical_days_and_probabilities(tmp_path):
    first = write_days(tmp_path / "a", days=2, rows_per_day=3000, seed=7)
    second = write_days(tmp_path / "b", days=2, rows_per_day=3000, seed=7)
    for left, right in zip(first, second, strict=True):
        assert gzip.open(left).read() == gzip.open(right).read()
        np.testing.assert_array_equal(read_probabilities(left), read_probabilities(right))
    other = write_days(tmp_path / "c", days=1, rows_per_day=3000, seed=8)
    assert gzip.open(other[0]).read() != gzip.open(first[0]).read()
    assert gzip.open(first[0]).read() != gzip.open(first[1]).read(), "days must differ from each other"


def test_labels_follow_the_planted_probabilities(tmp_path):
    path = tmp_path / "day_0"
    write_day(path, 40_000, day=0, model=ClickModel(seed=3, ctr=0.25))
    labels = np.array([naive_parse_line(line)[0] for line in path.open()])
    probability = read_probabilities(path)
    assert len(labels) == len(probability) == 40_000
    assert abs(labels.mean() - 0.25) < 0.015
    assert abs(labels.mean() - probability.mean()) < 0.01
    # The oracle is informative and far from perfect, like real click logs.
    assert 0.78 < roc_auc_score(labels, probability) < 0.95


def test_features_look_like_criteo(tmp_path):
    path = tmp_path / "day_0"
    write_day(path, 20_000, day=0, model=ClickModel(seed=1))
    rows = [naive_parse_line(line) for line in path.open()]
    dense = np.array([[np.nan if v is None else v for v in row[1:14]] for row in rows])
    sparse = [[row[14 + f] for row in rows] for f in range(26)]
    assert np.nanmin(dense[:, 1]) < 0, "I2 has negative counts in Criteo"
    assert np.nanmin(np.delete(dense, 1, axis=1)) >= 0
    assert 0.35 < np.isnan(dense[:, 0]).mean() < 0.55
    assert np.nanmax(dense[:, 4]) > 100_000, "heavy tails"
    distinct = [len({v for v in values if v is not None}) for values in sparse]
    assert distinct[8] <= 3 and distinct[2] > 2_000, "vocabularies from a handful to many thousands"
    assert all(d <= size for d, size in zip(distinct, VOCABULARY_SIZES, strict=True))
    assert 0.7 < np.mean([v is None for v in sparse[21]]) < 0.82


@pytest.mark.parametrize("ctr", [0.03, 0.25])
def test_bias_is_solved_for_the_requested_click_rate(ctr):
    sample = ClickModel(seed=0, ctr=ctr).sample(np.random.default_rng(5), 50_000)
    assert abs(sample.probability.mean() - ctr) < 0.01
