"""The summary block ``kedro run`` ends with: what each stage made, and what a rerun reused instead."""

from __future__ import annotations

from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.data.feature_metadata import FeatureMetadata
from criteo_dlrm.data.source_days import IngestionReport
from criteo_dlrm.engine.trained.reports import EvaluationReport, ExportReport, ScoringReport, TrainingSummary
from criteo_dlrm.summary import RunRecord, render

# The records the catalog's entries load and save (conf/base/catalog_*.yml: ``record``), by dataset.
RECORDS = {"ingestion_report": IngestionReport, "feature_metadata": FeatureMetadata, "training_summary": TrainingSummary,
           "evaluation_metrics": EvaluationReport, "scoring_report": ScoringReport, "export_report": ExportReport}  # fmt: skip


def _run(version: str, stored: dict, **kwargs) -> RunRecord:
    """What the summary hook holds once the datasets are saved: each as its node gave it (a record, from the
    stored forms written here)."""
    folders = {"raw_dir": "data/01_raw", "parquet_dir": "data/02_intermediate"}  # an ingestion report's, unread here
    saved = {name: RECORDS[name].from_dict({**folders, **value} if name == "ingestion_report" else value)
             for name, value in stored.items()}  # fmt: skip
    return RunRecord(version, saved, **kwargs)


def _metrics(**figures) -> dict:
    return {"rows": 1000, "ctr": 0.25, "auc": 0.7, "log_loss": 0.5, "normalized_entropy": 0.9, "calibration": 1.0,
            "accuracy": 0.75, **figures}  # fmt: skip


def _day(name: str, reused: bool) -> dict:
    return {"day": name, "rows": 20_000, "rejected": 0, "reused": reused}


def _metadata(**extra) -> dict:
    sparse = {f"SPARSE_{i}": {"table_size": 10} for i in range(26)}
    return {"format": 2, "encoding": "vocabulary", "label": {"rows": 40_000, "ctr": 0.25}, "dense": {}, "sparse": sparse,
            "vocabulary_sha256": "0" * 64, **extra}  # fmt: skip


def _training(resumed: int | None) -> dict:
    validation = _metrics()
    return {"steps": 300, "stopped_early": False, "best_step": 200, "samples_per_second": 1000.0,
            "resumed_from_step": resumed, "best_validation": validation}  # fmt: skip


def test_each_stage_says_whether_it_made_or_reused_its_output():
    days = [_day("day_0", True), _day("day_1", True)]
    reused = render(_run("v", {"ingestion_report": {"days": days}, "feature_metadata": _metadata(counted_in="v0"),
                                    "training_summary": _training(120)}))  # fmt: skip
    lines = reused.splitlines()
    assert lines[1] == "  ingestion   2 days (reused), 40,000 rows, 0 rejected"
    assert lines[2] == "  metadata    reused version v0: 40,000 training rows, CTR 0.2500, 260 embedding rows"
    assert lines[3].startswith("  training    resumed at step 120, 300 steps (ran every step)")
    made = render(_run("v", {"ingestion_report": {"days": [_day("day_0", False)]}, "feature_metadata": _metadata(),
                                  "training_summary": _training(None)}))  # fmt: skip
    lines = made.splitlines()
    assert lines[1] == "  ingestion   1 day (converted), 20,000 rows, 0 rejected", "one day, not '1 days'"
    assert lines[2].startswith("  metadata    counted: 40,000 training rows")
    assert lines[3].startswith("  training    300 steps")
    mixed = render(_run("v", {"ingestion_report": {"days": [_day("day_0", True), _day("day_1", False)]}}))
    assert "2 days (1 reused, 1 converted)" in mixed
    older = render(_run("v", {"ingestion_report": {"days": [{"day": "day_0", "rows": 5, "rejected": 0}]}}))
    assert "1 day (converted)" in older, "a report written before days said whether they were reused"


def test_one_unsplit_file_is_not_said_to_train_and_validate():
    """Issue 45 item 6: one unsplit file's summary read `train; train validate (first 50%) and test`."""
    from criteo_dlrm.config import MetadataConfig
    from criteo_dlrm.summary import split_line

    config = MetadataConfig.from_dict({})
    line = split_line(config.split(["train"]), config.test_share, ["train"])
    assert line == "train: one day, which would validate with none left to train (split it into days)"
    assert split_line(config.split(["day_0", "day_1"]), 0.5, ["day_0", "day_1"]).startswith(
        "day_0 train; day_1 validate"
    )


def test_training_says_when_it_reached_its_target_auc_or_that_it_did_not():
    """Issue 47 item 3: the time to the target AUC, MLPerf's figure of merit, in the run's summary."""
    target = {"auc": 0.75, "reached": True, "step": 150, "epoch": 0, "validation_auc": 0.7512,
              "train_seconds": 1234.56, "wall_seconds": 1500.0}  # fmt: skip
    reached = render(_run("v", {"training_summary": {**_training(None), "target": target}})).splitlines()
    assert reached[1:3] == [  # wrapped: the block's lines stay short
        "  training    300 steps (target AUC 0.75 at step 150: 1,234.6 s of training, 1,500.0 s wall), kept",
        "              step 200, 1,000 samples/s",
    ]
    missed = {"auc": 0.8, "reached": False}
    summary = {**_training(None), "target": missed, "lookups_per_row": 214}
    lines = render(_run("v", {"training_summary": summary})).splitlines()
    assert "(ran every step)" in lines[1] and lines[2:4] == [
        "              multi-hot: 214 lookups a row",
        "              target AUC 0.8 not reached",
    ]


def test_training_says_which_precision_auto_chose_and_why():
    why = "this CPU's bf16 matmuls run 6.00x its fp32 ones (900 against 150 GFLOP/s; bf16 from 1.5x)"
    summary = {**_training(None), "precision": {"precision": "bf16", "precision_auto": why}}
    lines = render(_run("v", {"training_summary": summary})).splitlines()
    assert " ".join(line.strip() for line in lines[2:4]) == f"precision auto: bf16, {why}"
    assert lines[1].endswith(", bf16, 1,000 samples/s"), "the training line names what it trained in"
    set_precision = {**_training(None), "precision": {"precision": "fp32"}}
    rendered = render(_run("v", {"training_summary": set_precision}))
    assert "precision" not in rendered, "a set one: no line of its own"
    assert rendered.splitlines()[1].endswith("kept step 200, fp32, 1,000 samples/s")


def test_training_on_the_cpu_says_its_thread_count_which_decides_the_last_digits():
    """Issue 62 item 14: the bundled run's last digits followed the machine's load (num_threads: null takes the
    idle cores) and nothing said so."""
    one = {**_training(None), "precision": {"precision": "fp32"}, "threads": 1}
    assert (
        render(_run("v", {"training_summary": one}))
        .splitlines()[1]
        .endswith("kept step 200, fp32, 1 thread, 1,000 samples/s")
    )
    two = {**one, "threads": 2, "processes": 2}
    assert "fp32, 2 threads a process, 1,000" in render(_run("v", {"training_summary": two}))
    gpu = {**one, "device": "cuda:0"}
    assert "thread" not in render(_run("v", {"training_summary": gpu}))


def test_the_ingestion_summary_says_which_days_train_validate_and_test():
    from criteo_dlrm.summary import split_line

    names = ["day_0", "day_1", "day_2", "day_3"]
    assert split_line(MetadataConfig().split(names), 0.5, names) == (
        "day_0, day_1, day_2 train; day_3 validate (first 50%) and test (last 50%)"
    )
    config = MetadataConfig(train_days=["day_1"], test_days=["day_3"])
    assert split_line(config.split(names), 0.5, names) == "day_1 train; day_2 validate; day_3 test; day_0 unused"


def test_every_line_of_a_criteo_1tb_sized_run_stays_within_100_columns_and_keeps_paths_whole():
    """Issue 62 item 15: summary lines went past 100 columns with a terabyte's counts, a reused version and a
    below-prior warning; a path longer than a line is not broken inside (it is copied from there)."""
    ingestion = {"days": [_day(f"terabyte_day_{i}", reused=i < 20) for i in range(24)]}
    metadata = _metadata(counted_in="2026-12-03T15.07.43.348Z")
    metadata["label"] = {"rows": 4_195_197_692, "ctr": 0.0325}
    metadata["sparse"] = {f"SPARSE_{i}": {"table_size": 39_884_406} for i in range(26)}
    evaluation = {
        "checkpoint_version": "2026-12-03T15.07.43.348Z", "days": [f"terabyte_day_{i}" for i in range(20, 24)],
        "model": _metrics(rows=178_274_637, auc=0.48, log_loss=0.9, normalized_entropy=1.2),
        "model_raw": _metrics(rows=178_274_637, auc=0.48, log_loss=0.9, normalized_entropy=1.2),
        "calibration_by_decile": {"calibrated": {"expected_calibration_error": 0.01}},
        "calibration_method": "platt", "prior_baseline": _metrics(log_loss=0.55), "rows_evaluated": "test",
    }  # fmt: skip
    long_path = "/scratch/" + "x" * 120 + "/predictions.parquet"
    scoring = {"checkpoint_version": "2026-12-03T15.07.43.348Z", "rows": 4_195_197_692, "mean_prediction": 0.0325,
               "metrics": _metrics(auc=0.8), "unseen_share": 0.02}  # fmt: skip
    saved = {"ingestion_report": ingestion, "feature_metadata": metadata, "evaluation_metrics": evaluation,
             "training_summary": {**_training(None), "reused_version": "2026-12-03T15.07.43.348Z",
                                  "samples_per_second": 2_500_000.0, "steps": 67_000_000},
             "scoring_report": scoring}  # fmt: skip
    text = render(_run("2026-12-05T02.15.15.507Z", saved, paths={"predictions": long_path}))
    lines = text.splitlines()
    assert all(len(line) <= 100 for line in lines if long_path not in line), text
    assert f"              {long_path}" in lines, "the path whole, on a line of its own"
    assert "4,195,197,692 training rows" in text and "1,036,994,556 embedding rows" in text.replace("\n", " ")


def test_a_stage_that_made_its_output_again_says_why_it_did_not_reuse_the_earlier_one():
    """Issue 62 item 12: the summary said 'converted', 'counted' and the steps, not why nothing was reused."""
    days = [{**_day("day_0", False), "parquet": "data/02_intermediate/day_0.parquet",
             "converted_because": "the raw file's modification time changed"},
            {**_day("day_1", False), "parquet": "data/02_intermediate/day_1.parquet",
             "converted_because": "the raw file's modification time changed"},
            {**_day("day_2", False), "parquet": "data/02_intermediate/day_2.parquet", "converted_because": "damaged"},
            {**_day("day_3", False), "parquet": "data/02_intermediate/day_3.parquet"}]  # fmt: skip
    why = "version v0 was counted from other days"
    training = {**_training(None), "trained_because": "version v0 trained with other training.learning_rate"}
    text = render(_run("v", {"ingestion_report": {"days": days}, "feature_metadata": _metadata(counted_because=why),
                                  "training_summary": training}))  # fmt: skip
    lines = text.splitlines()
    assert lines[1] == "  ingestion   4 days (converted), 80,000 rows, 0 rejected"
    assert lines[2:4] == [
        "              converted again: day_0, day_1 (the raw file's modification time changed)",
        "              converted again: day_2 (damaged)",
    ], "day_3 had no conversion before: not named"
    assert lines[4].startswith("  metadata    counted (version v0 was counted from other days): 40,000 training rows")
    assert lines[5].startswith("              260 embedding rows") and lines[6].startswith("  training    300 steps")
    assert lines[7] == "              not reused: version v0 trained with other training.learning_rate"
