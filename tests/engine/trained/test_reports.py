"""The reports read as records: what each says in the run's block and what it logs, from the JSON its node wrote."""

from criteo_dlrm.engine.trained.reports import EvaluationReport, ExportReport, ScoringReport, TrainingSummary

VALIDATION = {"rows": 1000, "ctr": 0.25, "auc": 0.7512, "log_loss": 0.48123, "normalized_entropy": 0.9012,
              "calibration": 1.0134, "accuracy": 0.75}  # fmt: skip
PRIOR = {**VALIDATION, "auc": 0.5, "log_loss": 0.55, "normalized_entropy": 1.0, "calibration": 1.0}


def _summary(**changes) -> dict:
    return {"steps": 300, "best_step": 200, "samples_per_second": 41234.5, "stopped_early": True,
            "best_validation": VALIDATION, "history": [{"step": 100, "epoch": 0, **VALIDATION}, {"step": 200, "epoch": 0, **VALIDATION}],
            "device": "cpu", "processes": 1, "run_version": "v", "in_progress_checkpoint": None, **changes}  # fmt: skip


def test_a_training_summary_keeps_what_it_does_not_know_and_says_its_lines():
    stored = _summary(written_by_a_later_version=[1])
    summary = TrainingSummary.from_dict(stored)
    assert summary.others == {"written_by_a_later_version": [1]} and summary.run_version == "v"
    assert {key: value for key, value in summary.to_dict().items() if key in stored} == stored, "written back whole"
    assert summary.lines(evaluated=True) == ["training    300 steps (stopped early), kept step 200, 41,234 samples/s"]
    alone = TrainingSummary.from_dict(_summary(resumed_from_step=120, lookups_per_row=214, precision=None))
    assert alone.lines(evaluated=False) == [
        "training    resumed at step 120, 300 steps (stopped early), kept step 200, 41,234 samples/s",
        "            multi-hot: 214 lookups a row",
        "            validation AUC 0.7512, log loss 0.48123, NE 0.9012, calibration 1.013",
    ]


def test_a_training_summary_logs_each_validation_at_its_step_and_the_kept_model_at_its_own():
    target = {"auc": 0.75, "reached": True, "step": 200, "train_seconds": 12.5, "wall_seconds": 15.0}
    tracked = TrainingSummary.from_dict(_summary(target=target, precision={"precision": "bf16"})).tracked()
    steps = {step: values for values, step in tracked.metrics if step is not None and "validation_auc" in values}
    assert sorted(steps) == [100, 200] and steps[100]["validation_log_loss"] == VALIDATION["log_loss"]
    kept = next(values for values, step in tracked.metrics if "kept_validation_auc" in values)
    assert kept["kept_validation_auc"] == VALIDATION["auc"]
    assert ({"time_to_target_train_seconds": 12.5, "time_to_target_wall_seconds": 15.0}, 200) in tracked.metrics
    assert tracked.tags == {"device": "cpu", "stopped_early": "True", "precision": "bf16", "embedding_backend": "torch"}


def test_an_evaluation_names_its_figures_by_the_rows_they_are_of():
    report = EvaluationReport.from_dict({
        "model": VALIDATION, "model_raw": VALIDATION, "prior_baseline": PRIOR,
        "calibration_by_decile": {"calibrated": {"expected_calibration_error": 0.0123}}, "oracle": None,
        "days": ["day_2"], "rows_evaluated": "test", "calibration_method": "platt", "checkpoint_version": "c1",
        "metadata_version": "m1", "source_days": [{"day": "day_2", "row_range": [500, 1000]}],
    })  # fmt: skip
    assert report.lines()[0] == "evaluation  checkpoint c1, 1,000 test rows of day_2:"
    ((values, step),) = report.tracked().metrics
    assert step is None and values["test_auc"] == 0.7512 and values["test_expected_calibration_error"] == 0.0123
    assert report.tracked().tags == {"evaluated_rows": "test", "calibration_method": "platt",
                                     "checkpoint_version": "c1", "metadata_version": "m1",
                                     "evaluated_days": "day_2[500:1000]"}  # fmt: skip


def test_scoring_and_export_say_where_their_files_went():
    scoring = ScoringReport.from_dict({"rows": 2500, "checkpoint_version": "c1", "mean_prediction": 0.25,
                                        "metrics": None, "unseen_share": 0.031})  # fmt: skip
    assert scoring.lines("data/07_model_output/predictions") == [
        "scoring     checkpoint c1: 2,500 rows, mean prediction 0.2500",
        "            3.1% of category values unseen in training",
        "            predictions data/07_model_output/predictions",
    ]
    export = ExportReport.from_dict({"onnx_bytes": 2_500_000, "exported_program_bytes": 3_100_000,
                                     "onnx_check": {"max_abs_difference": 2.4e-7}})  # fmt: skip
    assert export.lines() == ["export      ONNX 2.5 MB (onnxruntime max |difference| 2.4e-07), torch.export 3.1 MB"]


def test_each_report_writes_every_field_and_reads_back_equal():
    records = [
        TrainingSummary.from_dict(_summary(best_checkpoint="b.pt", source_days={"train": []})),
        EvaluationReport.from_dict(
            {
                "model": VALIDATION,
                "model_raw": VALIDATION,
                "prior_baseline": PRIOR,
                "days": ["day_2"],
                "trained_step": 7,
            }
        ),
        ScoringReport(rows=3, labelled=True, input_dir="in"),
        ExportReport(onnx_bytes=1, exported_program_bytes=2, onnx_check={}, encoder_format="f", others={"x": 1}),
    ]
    for record in records:
        stored = record.to_dict()
        names = {f for f in type(record).__dataclass_fields__ if f != "others"}
        assert set(stored) == names | set(record.others), type(record).__name__
        assert type(record).from_dict(stored) == record, type(record).__name__
