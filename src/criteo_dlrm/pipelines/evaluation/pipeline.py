from kedro.pipeline import Node, Pipeline

from .nodes import evaluate_checkpoint


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                evaluate_checkpoint,
                inputs=["dlrm_checkpoint", "params:evaluation"],
                outputs=["evaluation_metrics", "roc_curve_plot", "calibration_plot", "score_histogram_plot"],
                name="evaluate_checkpoint",
                tags=["evaluation"],
            )
        ]
    )
