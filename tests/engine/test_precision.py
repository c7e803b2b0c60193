"""precision: auto (issue 48 item 1): bf16 where the hardware runs bf16 matmuls natively and faster, decided by a
measured probe kept for the machine, and said in the run's summary."""

import json

import pytest
import torch

from criteo_dlrm.engine import device as device_module
from criteo_dlrm.engine.device import resolve_precision


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
