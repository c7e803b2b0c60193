"""The file MLflow builds the logged model from ("models from code": no pickled object in the model)."""

import mlflow

from criteo_dlrm.tracking.model import CheckpointModel

mlflow.models.set_model(CheckpointModel())
