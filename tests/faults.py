"""Helpers of the fault-injection tests (each in the test file of the module it checks): run an action that must
fail with a given error, or be refused naming a file; flip a bit; encoded rows of a converted day."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from criteo_dlrm.common.errors import DataError
from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data.encoding import EncodedDays, FeatureEncoder
from criteo_dlrm.data.lineage import encoded_lineage
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.data.source_days import SourceDay, SourceDays
from criteo_dlrm.datasets import EncodedArraysDataset


def fails_with(kind: type, action, match: str) -> str:
    """Run ``action``; it must fail with ``kind`` (perhaps wrapped by Kedro) and a message matching ``match``."""

    with pytest.raises(Exception) as caught:
        action()
    chain, error = [], caught.value
    while error is not None and len(chain) < 10:
        chain.append(error)
        error = error.__cause__ or error.__context__
    assert any(isinstance(e, kind) for e in chain), caught.value
    assert re.search(match, str(caught.value)), caught.value
    return str(caught.value)


def refused(action, path: Path) -> str:
    """Run ``action``; it must fail with a ``DataError`` (perhaps wrapped by Kedro) naming ``path``."""
    from criteo_dlrm.cli import user_error

    with pytest.raises(Exception) as caught:
        action()
    assert isinstance(user_error(caught.value), DataError), caught.value
    assert str(path) in str(caught.value), caught.value
    return str(caught.value)


def flip(path: Path, position: int, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 1 << bit
    path.write_bytes(bytes(data))


def encoded_rows(converted_day, tmp_path) -> tuple[EncodedArraysDataset, EncodedDays]:
    _, parquet, _ = converted_day
    metadata, vocabularies = compute_feature_metadata([parquet], MetadataConfig(min_expected_clicks=0), progress=False)
    metadata = dataclasses.replace(
        metadata, source_days=SourceDays(train=[SourceDay(day="day_0", rows=3000, fingerprint="f")])
    )
    encoder = FeatureEncoder.from_metadata(metadata, vocabularies)
    lineage = encoded_lineage(metadata, "v1", metadata.source_days.train)
    return EncodedArraysDataset(str(tmp_path / "train_features")), EncodedDays(encoder, [str(parquet)], lineage, 1)
