"""precision: auto (issue 48 item 1): bf16 where the hardware runs bf16 matmuls natively and faster, decided by a
measured probe kept for the machine, and said in the run's summary; on a CPU, only where the run's own step
measures faster in bf16 (issue 61 item 1)."""

import json

import pytest
import torch

from criteo_dlrm.config.training import TrainingConfig
from criteo_dlrm.engine import device as device_module
from criteo_dlrm.engine.device import resolve_precision
from criteo_dlrm.engine.training import precision as precision_module
from criteo_dlrm.engine.training.precision import choose_precision
from tests.conftest import TINY_MODEL


@pytest.fixture
def probe(tmp_path, monkeypatch):
    """The matmul probe with made-up rates, counting its measurements, its cache in ``tmp_path``."""
    calls = []

    def rates(fp32: float, bf16: float):
        def measured(dtype, seconds=0.25, size=1024):
            calls.append(dtype)
            return fp32 if dtype == torch.float32 else bf16

        monkeypatch.setattr(device_module, "matmul_rate", measured)

    monkeypatch.setattr(device_module, "PROBE_CACHE", tmp_path / "probe.json")
    return rates, calls


@pytest.mark.parametrize(
    ("fp32", "bf16", "chosen"),
    [(150.0, 900.0, "bf16"), (150.0, 250.0, "bf16"), (150.0, 6.0, "fp32"), (150.0, 200.0, "fp32")],
    ids=["amx", "avx512-bf16", "avx2-emulated", "barely-faster"],
)
def test_auto_takes_bf16_on_a_cpu_whose_bf16_matmuls_measure_faster(probe, fp32, bf16, chosen):
    rates, _ = probe
    rates(fp32, bf16)
    precision, why = resolve_precision("auto", torch.device("cpu"))
    assert precision == chosen and f"{bf16 / fp32:.2f}x" in why


def test_the_probe_runs_once_per_machine_and_set_precisions_are_kept(probe, tmp_path):
    rates, calls = probe
    rates(150.0, 900.0)
    assert resolve_precision("auto", torch.device("cpu"))[0] == "bf16"
    assert resolve_precision("auto", torch.device("cpu"))[0] == "bf16"
    assert len(calls) == 2, "measured once (fp32 and bf16), then read from the cache"
    [entry] = json.loads((tmp_path / "probe.json").read_text()).values()
    assert entry == {"fp32": 150.0, "bf16": 900.0}
    assert resolve_precision("fp32", torch.device("cpu")) == ("fp32", "set")
    assert resolve_precision("bf16", torch.device("cpu")) == ("bf16", "set")


def test_the_real_probe_measures_this_cpu(tmp_path, monkeypatch):
    monkeypatch.setattr(device_module, "PROBE_CACHE", tmp_path / "probe.json")
    rates = device_module.cpu_matmul_rates()
    assert rates["fp32"] > 0 and rates["bf16"] > 0


@pytest.mark.parametrize(
    "entry",
    [{"fp32": "150", "bf16": "900"}, {"fp32": 0, "bf16": 900.0}, {"bf16": 900.0}, "fast", {"fp32": True, "bf16": 9}],
    ids=["strings", "zero", "a missing key", "not a mapping", "a boolean"],
)
def test_a_cache_entry_of_the_wrong_types_is_measured_again_and_rewritten(probe, tmp_path, entry):
    rates, calls = probe
    rates(150.0, 900.0)
    key = f"{device_module.cpu_name()} | torch {torch.__version__} | {torch.get_num_threads()} threads"
    (tmp_path / "probe.json").write_text(json.dumps({key: entry, "another machine": {"fp32": 1.0, "bf16": 2.0}}))
    assert resolve_precision("auto", torch.device("cpu"))[0] == "bf16"
    assert len(calls) == 2, "measured again"
    cached = json.loads((tmp_path / "probe.json").read_text())
    assert cached == {key: {"fp32": 150.0, "bf16": 900.0}, "another machine": {"fp32": 1.0, "bf16": 2.0}}


def test_a_cache_that_cannot_be_rewritten_is_named_and_the_run_goes_on(probe, tmp_path, monkeypatch, logged):
    rates, calls = probe
    rates(150.0, 900.0)
    monkeypatch.setattr(device_module, "PROBE_CACHE", tmp_path / "read-only" / "probe.json")
    monkeypatch.setattr(
        device_module,
        "write_bytes_atomically",
        lambda *a: (_ for _ in ()).throw(PermissionError(13, "Permission denied")),
    )
    assert resolve_precision("auto", torch.device("cpu"))[0] == "bf16"
    [line] = [line for line in logged if "could not keep them" in line]
    assert str(tmp_path / "read-only" / "probe.json") in line and "Permission denied" in line


# precision: auto decided by the run's own step (issue 61 item 1): on an AMX CPU the default model trained 0.91x
# fp32 in bf16 although its matmuls run 7.8x.


@pytest.fixture
def step_probe(probe, tmp_path, monkeypatch):
    """The matmul probe saying bf16 is 6x fp32, and the step probe with made-up rates, counting its
    measurements, its cache in ``tmp_path``."""
    rates, _ = probe
    rates(150.0, 900.0)
    steps = []

    def step_rates(fp32: float, bf16: float):
        def measured(model_config, config, device=None):
            steps.append(config.batch_size.train)
            return {"fp32": fp32, "bf16": bf16}

        monkeypatch.setattr(precision_module, "measure_step_rates", measured)

    monkeypatch.setattr(precision_module, "STEP_CACHE", tmp_path / "steps.json")
    return step_rates, steps


def _auto(**training):
    config = TrainingConfig.from_dict({**TINY_MODEL, "precision": "auto", **training})
    return config, config.model_config([1000] * 26)


@pytest.mark.parametrize(
    ("fp32", "bf16", "chosen"),
    [(30_000.0, 27_300.0, "fp32"), (30_000.0, 31_000.0, "fp32"), (30_000.0, 61_000.0, "bf16")],
    ids=["bf16 slower (the default model)", "bf16 barely faster", "bf16 2x (a wide model)"],
)
def test_auto_takes_bf16_only_where_the_run_s_own_step_measures_it_faster(step_probe, fp32, bf16, chosen):
    rates, steps = step_probe
    rates(fp32, bf16)
    config, model_config = _auto()
    precision, why, speedup = choose_precision(config, model_config, torch.device("cpu"))
    assert precision == chosen and speedup == pytest.approx(bf16 / fp32)
    assert f"this run's step trains {bf16 / fp32:.2f}x as fast in bf16" in why and "6.00x its fp32" in why
    assert steps == [config.batch_size.train]


def test_auto_on_a_gpu_with_bf16_times_the_run_s_step_too(step_probe, monkeypatch):
    """On an H200 the Kaggle-like model trained 0.79-0.93x fp32 in bf16, which auto took for any GPU with bf16."""
    rates, steps = step_probe
    rates(1.38e6, 1.2e6)
    monkeypatch.setattr(precision_module, "resolve_precision", lambda setting, device: ("bf16", "NVIDIA H200 has bf16"))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    config, model_config = _auto()
    precision, why, speedup = choose_precision(config, model_config, torch.device("cuda"))
    assert precision == "fp32" and speedup == pytest.approx(1.2 / 1.38) and "NVIDIA H200 has bf16" in why
    assert steps == [config.batch_size.train]
    assert precision_module.step_key(model_config, config, torch.device("cuda")).startswith("NVIDIA H200 | ")


def test_the_step_probe_runs_once_per_step_shape_and_not_where_the_matmuls_rule_bf16_out(probe, step_probe, tmp_path):
    rates, steps = step_probe
    rates(30_000.0, 61_000.0)
    config, model_config = _auto()
    assert choose_precision(config, model_config, torch.device("cpu"))[0] == "bf16"
    assert choose_precision(config, model_config, torch.device("cpu"))[0] == "bf16"
    assert len(steps) == 1, "measured once, then read from the cache"
    wider, wider_model = _auto(batch_size={"train": 4096})
    choose_precision(wider, wider_model, torch.device("cpu"))
    assert steps == [config.batch_size.train, 4096], "another batch size is another step"
    assert len(json.loads((tmp_path / "steps.json").read_text())) == 2
    matmuls, _ = probe
    matmuls(150.0, 6.0)  # emulated bf16 (AVX2): fp32 without timing a step
    (tmp_path / "probe.json").unlink()
    assert choose_precision(*_auto(batch_size={"train": 64}), torch.device("cpu"))[:3:2] == ("fp32", None)
    assert len(steps) == 2
    assert choose_precision(_auto(precision="bf16")[0], model_config, torch.device("cpu")) == ("bf16", "set", None)


def test_the_real_step_probe_times_the_configured_model_in_both_precisions_leaving_the_seed_alone():
    config, model_config = _auto(batch_size={"train": 128})
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    rates = precision_module.measure_step_rates(model_config, config)
    assert rates.keys() == {"fp32", "bf16"} and min(rates.values()) > 0
    assert torch.equal(torch.rand(3), expected), "the probe leaves the run's random state as it was"
    sharded = TrainingConfig.from_dict(
        {**TINY_MODEL, "embedding_backend": "torchrec", "embedding_optimizer": "rowwise_adagrad"}
    )
    assert not precision_module.probe_config(sharded).embedding_backend.sharded  # timed with the tables on torch
