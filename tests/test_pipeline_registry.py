"""Which pipelines must run first, named in messages."""

from criteo_dlrm.pipeline_registry import pipelines_to_run_first, producers_of


def test_producers_are_found_from_the_pipeline_modules():
    assert producers_of("feature_metadata") == ["metadata"]
    assert producers_of("dlrm_checkpoint") == ["training"]
    assert producers_of("params:ingestion") == []


class _Catalog:
    def __init__(self, existing):
        self.existing = set(existing)

    def exists(self, name):
        return name in self.existing


def test_every_upstream_pipeline_is_named_in_run_order():
    assert pipelines_to_run_first(["dlrm_checkpoint"], _Catalog(set())) == [
        "ingestion",
        "metadata",
        "training",
    ]
    assert pipelines_to_run_first(["dlrm_checkpoint"], _Catalog({"ingestion_report"})) == [
        "metadata",
        "training",
    ]


def test_every_node_s_type_hints_resolve_at_run_time():
    """Kedro reads every node function's type hints; one naming a type imported for type checkers only made it warn
    ("Could not extract type hints from function evaluate_checkpoint") on every run."""
    import typing

    from criteo_dlrm.pipeline_registry import PIPELINES, _pipeline

    functions = {node.func for name in PIPELINES for node in _pipeline(name).nodes}
    assert len(functions) >= 5
    for function in functions:
        typing.get_type_hints(function)  # raises NameError for a name missing at run time
