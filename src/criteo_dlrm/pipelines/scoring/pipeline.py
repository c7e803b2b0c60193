from kedro.pipeline import Node, Pipeline

from .nodes import export_model, score_new_days


def create_pipeline(**kwargs) -> Pipeline:
    return Pipeline(
        [
            Node(
                score_new_days,
                inputs=["dlrm_checkpoint", "params:scoring"],
                outputs=["predictions", "scoring_report"],
                name="score_new_days",
                tags=["scoring"],
            ),
            Node(
                export_model,
                inputs=["dlrm_checkpoint", "params:scoring"],
                outputs=["dlrm_onnx", "dlrm_exported_program", "serving_encoder", "export_report"],
                name="export_model",
                tags=["scoring", "export"],
            ),
        ]
    )
