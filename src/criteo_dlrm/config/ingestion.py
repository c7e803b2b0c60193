"""``parameters_ingestion.yml``: raw day files to typed Parquet."""

from __future__ import annotations

from dataclasses import dataclass

from criteo_dlrm.config.base import Checks, Config


@dataclass
class IngestionConfig(Config):
    raw_dir: str = "data/01_raw"
    output_dir: str = "data/02_intermediate"
    force: bool = False
    max_reject_fraction: float = 0.0
    rows_per_day: int | None = None
    workers: int | None = None
    block_size_mb: float = 4.0

    def problems(self, prefix: str = "") -> list[str]:
        checks = Checks(self, prefix)
        checks.need(0.0 <= self.max_reject_fraction <= 1.0, "max_reject_fraction", "must be a share from 0 to 1")
        checks.at_least(1, "rows_per_day", "workers", optional=True)
        checks.need(1 / 64 <= self.block_size_mb <= 2048, "block_size_mb", "must be from 1/64 to 2048 (MB)")
        return checks.problems

    @property
    def block_size(self) -> int:
        """Bytes of decompressed text parsed per block."""
        return int(self.block_size_mb * (1 << 20))
