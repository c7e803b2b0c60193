"""The preprocessing engines behind one protocol, chosen once from ``preprocessing.engine``.

An engine runs the per-item work of ingestion, encoding and the stored shuffle (``run``: the same function on
each item, so the outputs are the same files), counts the feature metadata (``count_metadata``: the same record
and vocabularies), and owns whatever it needs for a run (``start`` and ``stop``: Spark's session). The local
engine is this machine's worker processes (``common.parallel``, ``data.metadata``); the Spark engine is this
package's. A new engine is one more class in ``ENGINES``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from criteo_dlrm.common.parallel import Runner, run_parallel
from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.config.preprocessing import PreprocessingConfig
from criteo_dlrm.data.feature_metadata import FeatureMetadata
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.spark.tasks import run_on_spark


class PreprocessingEngine(Protocol):
    run: Runner
    settings_key: str | None  # the Kedro config (``conf/*/<key>.yml``) its ``start`` takes; None: none

    def count_metadata(
        self, train_paths: Sequence[str | Path], config: MetadataConfig
    ) -> tuple[FeatureMetadata, dict[str, np.ndarray]]: ...

    def start(self, settings: Mapping) -> None: ...

    def stop(self) -> None: ...


class LocalEngine:
    """This machine's worker processes."""

    run: Runner = staticmethod(run_parallel)
    settings_key = None

    def count_metadata(self, train_paths, config):
        return compute_feature_metadata(train_paths, config)

    def start(self, settings: Mapping) -> None:
        pass

    def stop(self) -> None:
        pass


class SparkEngine:
    """Apache Spark: one task per item (``spark.tasks``), the counting in Spark SQL (``spark.metadata``), the
    session from ``spark.yml``'s settings (``spark.session``) started for a run and stopped after it."""

    run: Runner = staticmethod(run_on_spark)
    settings_key = "spark"

    def __init__(self) -> None:
        self.session = None

    def count_metadata(self, train_paths, config):
        from criteo_dlrm.spark.metadata import count_on_spark

        return count_on_spark(train_paths, config)

    def start(self, settings: Mapping) -> None:
        from criteo_dlrm.spark.session import spark_session

        self.session = spark_session(settings)

    def stop(self) -> None:
        if self.session is not None:
            self.session.stop()
            self.session = None


# ``preprocessing.engine``'s values (``config.preprocessing.ENGINES`` names them for the settings' check).
ENGINES: dict[str, type[PreprocessingEngine]] = {"local": LocalEngine, "spark": SparkEngine}


def preprocessing_engine(preprocessing: dict | PreprocessingConfig) -> PreprocessingEngine:
    """The engine ``params:preprocessing`` names (checked, with the parameter's name in any problem): one object
    per engine in a process, so the run's hook (which starts and stops it) and its nodes share it."""
    if not isinstance(preprocessing, PreprocessingConfig):
        preprocessing = PreprocessingConfig.from_dict(preprocessing, "preprocessing.")
    return _built(preprocessing.engine)


@functools.cache
def _built(name: str) -> PreprocessingEngine:
    return ENGINES[name]()
