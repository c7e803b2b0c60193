"""The Criteo layout: feature_metadata's tables read in column order."""

from criteo_dlrm.common.schema import SPARSE_COLUMNS, table_sizes


def test_table_sizes_are_in_column_order_whatever_the_order_metadata_lists_them_in():
    listed_backwards = {name: {"table_size": 2 + i} for i, name in reversed(list(enumerate(SPARSE_COLUMNS)))}
    assert list(listed_backwards) != SPARSE_COLUMNS
    assert table_sizes({"sparse": listed_backwards}) == [2 + i for i in range(26)]
