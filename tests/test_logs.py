"""loguru into Kedro's logging."""

import logging

from loguru import logger

from criteo_dlrm.logs import bridge_loguru


def test_loguru_messages_reach_standard_logging_under_the_module_name(caplog):
    bridge_loguru()
    with caplog.at_level(logging.INFO):
        logger.info("hello {}", "kedro")
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("tests.test_logs", "INFO", "hello kedro")
    ]
