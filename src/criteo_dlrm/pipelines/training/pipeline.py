from kedro.pipeline import Node, Pipeline

from .nodes import encode_features, train_dlrm


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                encode_features,
                inputs=["feature_metadata", "feature_vocabularies", "params:training", "params:preprocessing"],
                outputs=["train_features", "validation_features"],
                name="encode_features",
                tags=["training"],
            ),
            Node(
                train_dlrm,
                inputs=[
                    "train_features",
                    "validation_features",
                    "feature_metadata",
                    "feature_vocabularies",
                    "params:training",
                    "run_version",
                    "previous_training_summary",
                    "previous_dlrm_checkpoint",
                ],
                outputs=["dlrm_checkpoint", "training_summary"],
                name="train_dlrm",
                tags=["training"],
            ),
        ]
    )
