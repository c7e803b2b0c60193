"""Experiment tracking with kedro-mlflow: the run's metrics, artifacts, lineage tags and model (``hooks``), and
the checkpoint as an MLflow pyfunc model (``model``). Kedro-side: the core never imports it."""
