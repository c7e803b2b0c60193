from kedro.pipeline import Node, Pipeline

from .nodes import convert_raw_days


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                convert_raw_days,
                inputs=["params:ingestion", "params:preprocessing"],
                outputs="ingestion_report",
                name="convert_raw_days",
                tags=["ingestion"],
            )
        ]
    )
