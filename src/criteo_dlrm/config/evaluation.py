"""``parameters_evaluation.yml``: scoring the checkpoint's validation (or test) days."""

from __future__ import annotations

from dataclasses import dataclass

from criteo_dlrm.config.base import Checks, Config

PRECISIONS = ("fp32", "bf16")


def is_device(name: str) -> bool:
    """``auto``, ``cpu``, ``cuda`` or ``cuda:N`` (whether CUDA is there is checked when a run starts)."""
    kind, _, index = name.partition(":")
    return name in ("auto", "cpu", "cuda") or (kind == "cuda" and index.isdigit())


def check_device_and_precision(checks: Checks) -> None:
    checks.need(is_device(checks.config.device), "device", "must be auto, cpu, cuda or cuda:N")
    checks.one_of("precision", PRECISIONS)


@dataclass
class EvaluationConfig(Config):
    device: str = "auto"
    precision: str = "fp32"

    def problems(self, prefix: str = "") -> list[str]:
        checks = Checks(self, prefix)
        check_device_and_precision(checks)
        return checks.problems
