"""Raw Criteo TSV days (plain or gzip) to typed Parquet, streaming, with every bad line kept aside.

- ``files``: which files of a raw folder are days, their names, where their Parquet goes;
- ``reader`` and ``parsing``: pyarrow's CSV reader in blocks, cells parsed column-wise (no Python per cell);
- ``threads``: read-ahead and write-behind, so reading, parsing and writing overlap;
- ``rejects``: lines that were not converted, and the share a day may have;
- ``convert``: one file to one day (or to several, splitting Kaggle's ``train.txt``);
- ``days``: many files, reusing intact conversions, in worker processes.
"""

from criteo_dlrm.data.raw.convert import (
    TRAINING_LAYOUT,
    ConversionOptions,
    DayReport,
    convert_day,
    split_day,
)
from criteo_dlrm.data.raw.days import convert_days, convert_or_reuse, split_or_reuse
from criteo_dlrm.data.raw.files import (
    RawFolder,
    day_name,
    day_sort_key,
    find_day_files,
    find_scoring_input,
    is_labelled,
    parquet_folder,
    scan_raw_folder,
)
from criteo_dlrm.data.raw.parsing import parse_batch, parse_hex, parse_integers
from criteo_dlrm.data.raw.rejects import IngestionError, Reject

__all__ = [
    "TRAINING_LAYOUT",
    "ConversionOptions",
    "DayReport",
    "IngestionError",
    "RawFolder",
    "Reject",
    "convert_day",
    "convert_days",
    "convert_or_reuse",
    "day_name",
    "day_sort_key",
    "find_day_files",
    "find_scoring_input",
    "is_labelled",
    "parquet_folder",
    "parse_batch",
    "parse_hex",
    "parse_integers",
    "scan_raw_folder",
    "split_day",
    "split_or_reuse",
]
