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
