"""Records read from and written as plain values: nested records built from their stored forms, unknown keys kept,
unset fields left out where a record says so, and values that are not records (tensors) never copied."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Any

import torch

from criteo_dlrm.common.records import Record


@dataclass(frozen=True, kw_only=True)
class _Leaf(Record):
    OMIT_NONE = True

    name: str
    size: int | None = None


@dataclass(frozen=True, kw_only=True)
class _Tree(Record):
    leaf: _Leaf | None = None
    leaves: list[_Leaf] = field(default_factory=list)
    by_name: dict[str, _Leaf] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    others: dict[str, Any] = field(default_factory=dict)


def test_a_record_reads_its_nested_records_and_writes_back_what_it_read():
    weights = torch.arange(4.0)
    stored = {
        "leaf": {"name": "a", "size": 1},
        "leaves": [{"name": "b"}, {"name": "c", "size": 3}],
        "by_name": {"d": {"name": "d"}},
        "tensors": {"w": weights},
        "written_by_a_later_version": [1, 2],
    }
    tree = _Tree.from_dict(stored)
    assert tree.leaf == _Leaf(name="a", size=1) and tree.leaves == [_Leaf(name="b"), _Leaf(name="c", size=3)]
    assert tree.by_name == {"d": _Leaf(name="d")} and tree.others == {"written_by_a_later_version": [1, 2]}
    assert tree.tensors is stored["tensors"], "what holds no record is kept as it was read, never copied"
    again = tree.to_dict()
    assert again["leaves"] == [{"name": "b"}, {"name": "c", "size": 3}], "unset fields left out, as they were"
    assert again["tensors"]["w"] is weights
    assert {key: value for key, value in again.items() if key != "tensors"} == {
        key: value for key, value in stored.items() if key != "tensors"
    }
    assert _Tree.from_dict(tree) is tree, "a record is read as it is"
    assert _Tree.from_dict({}).leaf is None, "a field the stored form lacks takes its default"


def test_the_run_s_records_hold_records_where_they_held_dicts():
    """Issue 60 item 4: the metrics and the source days were dicts inside the typed records (the run state, the
    result, the reports, the checkpoint, the metadata): read by string keys at 444 places."""
    from criteo_dlrm.data.feature_metadata import FeatureMetadata
    from criteo_dlrm.data.source_days import IngestedDay, IngestionReport, RawSource, SourceDay, SourceDays
    from criteo_dlrm.engine.trained.checkpoint import Checkpoint, StateFolder, TrainedWith
    from criteo_dlrm.engine.trained.reports import (
        Calibration,
        EvaluationReport,
        Metrics,
        ScoringReport,
        Target,
        TrainingSummary,
        Validation,
    )
    from criteo_dlrm.engine.trained.result import TrainingResult
    from criteo_dlrm.engine.training.run_state import RunState

    expected = {
        RunState: {"best": Validation | None, "history": list[Validation], "target": Target | None},
        TrainingResult: {"best_metrics": Metrics, "history": list[Validation], "target": Target | None},
        TrainingSummary: {"best_validation": Metrics, "history": list[Validation], "target": Target | None,
                          "source_days": SourceDays | None},
        EvaluationReport: {"model": Metrics, "model_raw": Metrics, "prior_baseline": Metrics,
                           "oracle": Metrics | None, "source_days": list[SourceDay] | None,
                           "calibration_by_decile": dict[str, Calibration]},
        ScoringReport: {"metrics": Metrics | None, "source_days": list[SourceDay] | None},
        Checkpoint: {"trained_with": TrainedWith, "best_validation": Metrics | None, "history": list[Validation],
                     "sharded_state": StateFolder | None},
        TrainedWith: {"source_days": SourceDays | None},
        FeatureMetadata: {"source_days": SourceDays | None},
        SourceDay: {"source": RawSource | None},
        IngestionReport: {"days": list[IngestedDay]},
    }  # fmt: skip
    for record, fields in expected.items():
        hints = typing.get_type_hints(record)
        assert {name: hints[name] for name in fields} == fields, record.__name__
