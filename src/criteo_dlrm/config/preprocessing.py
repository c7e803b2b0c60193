"""``parameters_preprocessing.yml``: which engine runs ingestion, metadata and encoding."""

from __future__ import annotations

from dataclasses import dataclass

from criteo_dlrm.config.base import Checks, Config

# local: this machine's worker processes; spark: Apache Spark (conf/base/spark.yml, the spark extra).
ENGINES = ("local", "spark")


@dataclass
class PreprocessingConfig(Config):
    engine: str = "local"

    def problems(self, prefix: str = "") -> list[str]:
        checks = Checks(self, prefix)
        checks.one_of("engine", ENGINES)
        return checks.problems
