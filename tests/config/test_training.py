"""The typed training configuration: the project's defaults, every problem at once."""

import re

import pytest
import yaml

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.config.training import EmbeddingBackend, TrainingConfig
from tests.conftest import PROJECT_ROOT


def test_the_dataclass_defaults_are_the_projects_defaults():
    base = yaml.safe_load((PROJECT_ROOT / "conf/base/parameters_training.yml").read_text())["training"]
    assert TrainingConfig().to_dict() == base
    assert TrainingConfig.from_dict(base, "training.") == TrainingConfig()


def test_missing_keys_keep_their_defaults_and_lists_come_back_as_lists():
    config = TrainingConfig.from_dict({"dense_mlp": {"hidden_layer_sizes": (32, 8)}, "learning_rate": 1})
    assert config.dense_mlp.hidden_layer_sizes == [32, 8] and config.dense_mlp.output_size == 32
    assert config.learning_rate == 1.0 and isinstance(config.learning_rate, float)


def test_wrong_types_are_all_reported_with_their_field_names():
    with pytest.raises(ConfigError) as caught:
        TrainingConfig.from_dict(
            {
                "num_epochs": "abc",
                "batch_size": {"train": 1.5},
                "distributed": {"nproc_per_node": 0},
                "decay": "x",
                "reading_threads": 0,
            },
            prefix="training.",
        )
    message = str(caught.value)
    assert "training.num_epochs must be an integer, got 'abc'" in message
    assert "training.batch_size.train must be an integer, got 1.5" in message
    assert "training.distributed.nproc_per_node must be >= 1" in message
    assert "training.decay must be one of" in message
    assert "training.reading_threads must be >= 1, got 0" in message


def test_unknown_keys_are_named_with_their_path():
    with pytest.raises(
        ConfigError,
        match=r"training.early_stopping.patiense is not a parameter \(did you mean training.early_stopping.patience\?\)",
    ):
        TrainingConfig.from_dict({"early_stopping": {"patiense": 3}}, "training.")


def test_embedding_settings_that_only_one_backend_has_are_refused_naming_the_other():
    with pytest.raises(ConfigError) as caught:
        TrainingConfig.from_dict(
            {"embedding_optimizer": "rowwise_adagrad", "sharding": {"type": "table_wise"}}, prefix="training."
        )
    message = str(caught.value)
    assert "training.embedding_optimizer rowwise_adagrad is TorchRec's fused optimiser" in message
    assert "training.sharding.type only applies to embedding_backend: torchrec" in message
    with pytest.raises(ConfigError) as caught:
        TrainingConfig.from_dict(
            {"embedding_backend": "torchrec", "embedding_optimizer": "dense_adam", "sharding": {"type": "diagonal"}},
            prefix="training.",
        )
    message = str(caught.value)
    assert (
        "dense_adam has no fused TorchRec kernel" in message
        and "training.sharding.type must be null or one of" in message
    )
    config = TrainingConfig.from_dict(
        {"embedding_backend": "torchrec", "embedding_optimizer": "rowwise_adagrad", "sharding": {"type": "column_wise"}}
    )
    assert config.sharding.type == "column_wise"


def test_integers_beyond_64_bits_and_negative_seeds_are_refused_with_the_others():
    with pytest.raises(ConfigError) as caught:
        TrainingConfig.from_dict({"seed": -1, "max_steps": 2**70, "prediction_hidden_sizes": [64, 2**64]}, "training.")
    message = str(caught.value)
    assert "training.seed must be >= 0, got -1" in message
    assert f"training.max_steps must fit a 64-bit integer (-2**63 to 2**63 - 1), got {2**70}" in message
    assert "training.prediction_hidden_sizes must fit a 64-bit integer" in message
    TrainingConfig.from_dict({"seed": 2**63 - 1}, "training.")


def test_the_embedding_backend_is_an_enum_no_module_compares_by_name():
    """Issue 60 item 5: ``embedding_backend`` is an ``EmbeddingBackend`` member that code asks (``.sharded``); no
    module of src compares the backend's name, where a third backend would have to be added at every site. The
    YAML and what is written back (lineage, the job file) keep the plain name."""
    comparison = re.compile(r"embedding_backend\s*(?:[!=]=|(?:not\s+)?in\b)|== \"torchrec\"|\"torchrec\" ==")
    sites = [
        f"{path.relative_to(PROJECT_ROOT)}:{number}"
        for path in sorted((PROJECT_ROOT / "src").rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if comparison.search(line)
    ]
    assert sites == []
    sharded = TrainingConfig.from_dict({"embedding_backend": "torchrec", "embedding_optimizer": "rowwise_adagrad"})
    assert sharded.embedding_backend is EmbeddingBackend.TORCHREC and sharded.embedding_backend.sharded
    assert TrainingConfig.from_dict({}).embedding_backend is EmbeddingBackend.TORCH
    assert not TrainingConfig.from_dict({}).embedding_backend.sharded
    written = sharded.to_dict()
    assert type(written["embedding_backend"]) is str and yaml.safe_load(yaml.safe_dump(written)) == written
    assert TrainingConfig.from_dict(written) == sharded
    with pytest.raises(
        ConfigError, match=r"training\.embedding_backend must be one of \('torch', 'torchrec'\), got 'tf'"
    ):
        TrainingConfig.from_dict({"embedding_backend": "tf"}, "training.")
