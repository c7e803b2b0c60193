"""``parameters_scoring.yml``: new days to predictions, and the exported model."""

from __future__ import annotations

from dataclasses import dataclass, field

from criteo_dlrm.config.base import Checks, Config
from criteo_dlrm.config.evaluation import check_device_and_precision


@dataclass
class ExportConfig:
    check_rows: int = 4096
    tolerance: float = 1.0e-5


@dataclass
class ScoringConfig(Config):
    input_dir: str = "data/01_raw"
    parquet_dir: str = "data/07_model_output/scoring_input"
    max_reject_fraction: float = 0.0
    block_size_mb: float = 4.0
    device: str = "auto"
    precision: str = "fp32"
    export: ExportConfig = field(default_factory=ExportConfig)

    def problems(self, prefix: str = "") -> list[str]:
        checks = Checks(self, prefix)
        checks.need(bool(self.input_dir), "input_dir", "must name the folder to score")
        checks.need(0.0 <= self.max_reject_fraction <= 1.0, "max_reject_fraction", "must be a share from 0 to 1")
        checks.need(1 / 64 <= self.block_size_mb <= 2048, "block_size_mb", "must be from 1/64 to 2048 (MB)")
        check_device_and_precision(checks)
        checks.at_least(1, "export.check_rows")
        checks.positive("export.tolerance")
        return checks.problems

    @property
    def block_size(self) -> int:
        return int(self.block_size_mb * (1 << 20))
