"""Runs one distributed training in its own process for test_distributed (so a test can kill its workers).

python distributed_runner.py JOB.pkl    # (config dict, tiny_features) pickled; exit 1 with the message on error
"""

import pickle
import sys

from criteo_dlrm.common.errors import UserError
from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.engine.training.recipe import run_training

if __name__ == "__main__":
    with open(sys.argv[1], "rb") as handle:
        config, features = pickle.load(handle)
    try:
        run_training(
            TrainingConfig.from_dict(config),
            features["train"],
            features["validation"],
            features["metadata"],
            features["vocabularies"].arrays,
            "killed",
            "v",
        )
    except UserError as error:
        sys.exit(str(error))  # printed to stderr, exit code 1
