import logging

from loguru import logger

from criteo_dlrm.logs import bridge_loguru
from criteo_dlrm.pipeline_registry import pipelines_to_run_first, producers_of


def test_loguru_messages_reach_standard_logging_under_the_module_name(caplog):
    bridge_loguru()
    with caplog.at_level(logging.INFO):
        logger.info("hello {}", "kedro")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("tests.test_hooks", "INFO", "hello kedro")
    ]


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
