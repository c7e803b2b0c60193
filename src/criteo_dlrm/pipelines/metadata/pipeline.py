from kedro.pipeline import Node, Pipeline

from .nodes import compute_metadata


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                compute_metadata,
                inputs=[
                    "ingestion_report",
                    "params:metadata",
                    "params:preprocessing",
                    "previous_feature_metadata",
                    "previous_feature_vocabularies",
                ],
                outputs=["feature_metadata", "feature_vocabularies"],
                name="compute_feature_metadata",
                tags=["metadata"],
            )
        ]
    )
