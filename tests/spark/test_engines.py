"""The preprocessing engines: one class per ``preprocessing.engine``, chosen once from the settings."""

import pytest

from criteo_dlrm.common.errors import ConfigError
from criteo_dlrm.common.parallel import run_parallel
from criteo_dlrm.config.preprocessing import ENGINES as ENGINE_NAMES
from criteo_dlrm.data.metadata import compute_feature_metadata
from criteo_dlrm.spark.engines import ENGINES, LocalEngine, SparkEngine, preprocessing_engine
from criteo_dlrm.spark.tasks import run_on_spark


def test_each_engine_the_settings_accept_is_one_class_with_its_runner_and_settings():
    assert set(ENGINES) == set(ENGINE_NAMES)
    local, spark = preprocessing_engine({"engine": "local"}), preprocessing_engine({"engine": "spark"})
    assert type(local) is LocalEngine and local.run is run_parallel and local.settings_key is None
    assert type(spark) is SparkEngine and spark.run is run_on_spark and spark.settings_key == "spark"
    with pytest.raises(ConfigError, match="preprocessing.engine"):
        preprocessing_engine({"engine": "dask"})


def test_the_local_engine_counts_what_compute_feature_metadata_counts_and_starts_nothing(tmp_path):
    from criteo_dlrm.config.metadata import MetadataConfig
    from criteo_dlrm.data.raw import convert_day
    from criteo_dlrm.data.synthetic import ClickModel, write_day

    write_day(tmp_path / "day_0", 2000, day=0, model=ClickModel(seed=4))
    tiny_days = [convert_day(tmp_path / "day_0", tmp_path / "day_0.parquet").parquet]
    engine = preprocessing_engine({})
    engine.start({"spark.master": "local[1]"})  # nothing to start: no Spark session, no error
    config = MetadataConfig(min_expected_clicks=0, workers=1)
    counted, vocabularies = engine.count_metadata(tiny_days, config)
    expected, expected_vocabularies = compute_feature_metadata(tiny_days, config, progress=False)
    assert counted == expected and all((vocabularies[n] == expected_vocabularies[n]).all() for n in vocabularies)
    engine.stop()


@pytest.mark.parametrize("name", ["local", "spark"])
def test_the_run_s_hook_and_its_nodes_share_one_engine(name):
    """Issue 60 item 5: the engine was built by the hook (which starts and stops it) and again by each of the three
    preprocessing nodes from ``params:preprocessing``; one object now."""
    from types import SimpleNamespace

    from criteo_dlrm.config.preprocessing import PreprocessingConfig
    from criteo_dlrm.hooks import ParameterHooks, PreprocessingEngineHooks

    parameters = ParameterHooks()
    parameters.configs = {"preprocessing": PreprocessingConfig.from_dict({"engine": name}, "preprocessing.")}
    hooks = PreprocessingEngineHooks(parameters)
    hooks.after_context_created(SimpleNamespace(config_loader={"spark": {}}))
    assert hooks.engine is preprocessing_engine({"engine": name})  # as each node gets it from params:preprocessing
