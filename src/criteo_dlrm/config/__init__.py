"""Every pipeline's settings, one typed config per ``conf/base/parameters_<pipeline>.yml``.

Each config's fields are that file's keys and its defaults are that file's values (a test holds them
together), so a block that leaves a key out gets the project's default and a misspelt key is refused with
the closest known name, before any node runs.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.config.base import Config
from criteo_dlrm.config.evaluation import EvaluationConfig
from criteo_dlrm.config.ingestion import IngestionConfig
from criteo_dlrm.config.metadata import MetadataConfig
from criteo_dlrm.config.preprocessing import PreprocessingConfig
from criteo_dlrm.config.scoring import ScoringConfig
from criteo_dlrm.config.training import TrainingConfig

CONFIGS: dict[str, type[Config]] = {
    "preprocessing": PreprocessingConfig,
    "ingestion": IngestionConfig,
    "metadata": MetadataConfig,
    "training": TrainingConfig,
    "evaluation": EvaluationConfig,
    "scoring": ScoringConfig,
}


class ParameterError(ConfigError):
    """Parameters that no pipeline reads, or values no pipeline accepts."""


def parse_parameters(parameters: Mapping) -> dict[str, Config]:
    """Every pipeline's config from the whole parameter tree (``conf/base`` merged with ``conf/local``,
    ``--env`` and ``--params``).

    Raises:
        ParameterError: every unknown name (with the closest known one) and every invalid value, at once.
    """
    problems = []
    for section in parameters:
        if section not in CONFIGS:
            close = difflib.get_close_matches(str(section), list(CONFIGS), n=1)
            problems.append(f"{section} is not a parameter block" + (f" (did you mean {close[0]}?)" if close else ""))
    configs: dict[str, Config] = {}
    for section, config in CONFIGS.items():
        try:
            configs[section] = config.from_dict(parameters.get(section), f"{section}.")
        except ConfigError as error:
            problems += [line.strip() for line in str(error).splitlines()[1:]]
    if problems:
        raise ParameterError(
            "Invalid parameters:\n  " + "\n  ".join(problems) + "\nThe known ones, with their defaults and "
            "meanings, are in conf/base/parameters_<pipeline>.yml (and the parameters reference)."
        )
    return configs


__all__ = [
    "CONFIGS",
    "Config",
    "EvaluationConfig",
    "IngestionConfig",
    "MetadataConfig",
    "ParameterError",
    "PreprocessingConfig",
    "ScoringConfig",
    "TrainingConfig",
    "parse_parameters",
]
