"""What a training run produces and what is done with it: checkpoints (finished, in progress, sharded), the training
result, calibration, metrics, evaluation, scoring, export, plots, reports."""
