from kedro.pipeline import Node, Pipeline

from .nodes import evaluate_checkpoint, plot_evaluation


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                evaluate_checkpoint,
                inputs=["dlrm_checkpoint", "params:evaluation"],
                outputs=["validation_metrics", "evaluation_curves", "validation_labels", "validation_predictions"],
                name="evaluate_checkpoint",
                tags=["evaluation"],
            ),
            Node(
                plot_evaluation,
                inputs=["validation_metrics", "evaluation_curves", "validation_labels", "validation_predictions"],
                outputs=["roc_curve_plot", "calibration_plot", "score_histogram_plot"],
                name="plot_evaluation",
                tags=["evaluation"],
            ),
        ]
    )
