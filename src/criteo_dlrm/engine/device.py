"""Device choice and the CUDA switches (TF32, bf16 autocast), decided once from parameters."""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from loguru import logger

from criteo_dlrm.common.errors import ConfigError, Fix
from criteo_dlrm.common.parallel import available_cores
from criteo_dlrm.common.storage import write_bytes_atomically
from criteo_dlrm.config.evaluation import PRECISIONS  # one definition, the settings'

# precision: auto takes bf16 on a CPU whose bf16 matmuls run at least this many times its fp32 ones (AMX: 6x; an
# AMD CPU with AVX512_BF16: 1.65x, where bf16 training measured faster; AVX2 only: 0.04x, emulated).
BF16_SPEEDUP = 1.5
# Where the probe's rates are kept, per CPU model, torch version and thread count.
PROBE_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "criteo_dlrm" / "matmul_probe.json"


def resolve_device(name: str = "auto", parameter: str = "device") -> torch.device:
    """``auto`` -> CUDA when present, else CPU; ``cpu``, ``cuda``, ``cuda:N`` force it.

    ``parameter`` is the setting's name as the user wrote it (``training.device``), for the messages.

    Raises:
        ConfigError: CUDA asked for where there is none (or not that many GPUs).
    """
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise ConfigError(f"{parameter} {name!r} is not a device: use auto, cpu, cuda or cuda:N") from error
    if device.type == "cuda":
        if not torch.cuda.is_available():
            fix = Fix(params={parameter: "auto"})
            raise ConfigError(
                f"{parameter} is {name!r} but this machine has no usable CUDA device "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}). Use `{fix}` (or cpu).",
                fix=fix,
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"{parameter} is {name!r} but only {torch.cuda.device_count()} CUDA device(s) exist.")
    elif device.type != "cpu":
        raise ConfigError(f"{parameter} {name!r} is not supported: use auto, cpu, cuda or cuda:N")
    return device


def matmul_rate(dtype: torch.dtype, seconds: float = 0.25, size: int = 1024) -> float:
    """GFLOP/s of ``size``^3 matmuls in ``dtype`` on this process's CPU threads, over about ``seconds``."""
    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return 2 * size**3 * count / (time.perf_counter() - start) / 1e9


def cpu_name() -> str:
    """The CPU's model name (Linux's /proc/cpuinfo), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_key() -> str:
    """What decides a measured rate besides the work measured: the CPU model, torch's version, this process's
    threads."""
    return f"{cpu_name()} | torch {torch.__version__} | {torch.get_num_threads()} threads"


def cached_rates(cache: Path, key: str, measure: Callable[[], dict], what: str) -> dict[str, float]:
    """A rate per precision, kept in ``cache`` (a JSON mapping) under ``key``: read from it, else ``measure()``d
    (again, where the cache held something else: a hand edit, another version's format) and kept. A cache that
    cannot be written is named (``what`` was measured) and the run goes on."""
    try:
        cached = json.loads(cache.read_text())
    except (OSError, ValueError):
        cached = {}
    cached = cached if isinstance(cached, dict) else {}
    if _valid_rates(cached.get(key)):
        return {name: float(cached[key][name]) for name in PRECISIONS}
    rates = measure()
    try:
        write_bytes_atomically(cache, json.dumps({**cached, key: rates}, indent=1).encode())
    except OSError as error:
        logger.warning(
            "precision: auto measured {} but could not keep them in {} ({}): they are measured again at every run "
            "until it can be written (or set training.precision to fp32 or bf16).",
            what, cache, error.strerror or error,
        )  # fmt: skip
    return rates


def cpu_matmul_rates() -> dict:
    """This CPU's fp32 and bf16 matmul rates (GFLOP/s) at this process's thread count, measured once (half a
    second) and kept in ``PROBE_CACHE`` for the next runs on the same CPU, torch and threads."""
    return cached_rates(
        PROBE_CACHE,
        machine_key(),
        lambda: {"fp32": matmul_rate(torch.float32), "bf16": matmul_rate(torch.bfloat16)},
        "this CPU's matmul rates",
    )


def _valid_rates(rates) -> bool:
    """A cache entry of positive finite GFLOP/s for each precision (not a string, a 0 or a missing key)."""
    return isinstance(rates, dict) and all(
        isinstance(rates.get(name), int | float)
        and not isinstance(rates.get(name), bool)
        and math.isfinite(rates[name])
        and rates[name] > 0
        for name in PRECISIONS
    )


def resolve_precision(setting: str, device: torch.device) -> tuple[str, str]:
    """``(precision, why)``: ``fp32`` and ``bf16`` as set; ``auto`` bf16 where this hardware runs bf16 matmuls
    natively and faster (a CUDA device with bf16; a CPU whose measured bf16 matmul rate is at least
    ``BF16_SPEEDUP`` times its fp32 one), fp32 elsewhere."""
    if setting != "auto":
        return setting, "set"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", f"{torch.cuda.get_device_name(device)} has bf16"
        return "fp32", f"{torch.cuda.get_device_name(device)} has no bf16"
    rates = cpu_matmul_rates()
    ratio = rates["bf16"] / rates["fp32"]
    chosen = "bf16" if ratio >= BF16_SPEEDUP else "fp32"
    return chosen, (
        f"this CPU's bf16 matmuls run {ratio:.2f}x its fp32 ones ({rates['bf16']:,.0f} against "
        f"{rates['fp32']:,.0f} GFLOP/s; bf16 from {BF16_SPEEDUP}x)"
    )


def idle_cores(window: float = 0.3) -> float | None:
    """How many of this machine's cores were idle over the last ``window`` seconds (Linux's /proc/stat), or None
    where that cannot be read."""

    def sample() -> tuple[int, int]:
        with open("/proc/stat") as handle:
            values = [int(value) for value in handle.readline().split()[1:9]]
        return values[3] + values[4], sum(values)  # idle + iowait, all

    try:
        idle_before, total_before = sample()
        time.sleep(window)
        idle_after, total_after = sample()
    except (OSError, ValueError, IndexError):
        return None
    cores = os.cpu_count() or 1
    return cores * (idle_after - idle_before) / max(total_after - total_before, 1)


def default_threads() -> int:
    """PyTorch's CPU threads when ``num_threads`` is null: one per core that is idle when training starts.

    Threads that wait on a core another process keeps busy stall every step: beside one busy process on 2 cores,
    2 threads trained 3.4x slower than 1, while on an idle machine 2 threads are 1.35x faster than 1
    (benchmarks/threads.py). OpenMP's passive wait policy is no remedy (0.46x on an idle machine).
    """
    cores = os.cpu_count() or 1
    idle = idle_cores()
    return cores if idle is None else max(1, min(cores, round(idle)))


def configure_backends(device: torch.device, allow_tf32: bool, num_threads: int | None) -> dict:
    """Set CPU threads and, on CUDA, the TF32 switches. Returns what was set, for the run's record."""
    threads = num_threads or default_threads()
    torch.set_num_threads(threads)
    settings = {"num_threads": threads}
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
        torch.backends.cudnn.allow_tf32 = allow_tf32
        settings["tf32"] = allow_tf32
    return settings


@dataclass(frozen=True)
class Runtime:
    """Where and how a model computes, resolved once and passed as one value: its device, its precision (``fp32``,
    ``bf16``: resolved, never ``auto``) and the process group's backend (``gloo``, ``nccl``; None alone)."""

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    precision: str = "fp32"
    backend: str | None = None

    def autocast(self) -> contextlib.AbstractContextManager:
        """bf16 autocast on the device with ``bf16``; a no-op with ``fp32``."""
        return autocast(self.device, self.precision)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    """bf16 autocast on ``device`` when ``precision`` is ``bf16``; a no-op for ``fp32``."""
    if precision not in PRECISIONS:
        raise ConfigError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def compile_model(model: torch.nn.Module, mode: str = "default") -> torch.nn.Module:
    """``torch.compile`` the dense parts in place (``Module.compile`` keeps state-dict keys unchanged).

    The embedding lookups stay eager: their sparse gradients are not supported by compiled autograd.
    """
    for name in ("dense_mlp", "prediction_mlp"):
        getattr(model, name).compile(mode=mode)
    return model


def check_process_count(
    processes: int, device: torch.device, parameter: str = "training.distributed.nproc_per_node"
) -> None:
    """Refuse more training processes on the CPU than this machine has cores: each process needs a core for its
    step and its gradient exchange, so with more they take turns (64 on 2 cores trained nothing in 200 s while
    holding 13 GB). On CUDA one process drives one GPU, whatever the cores."""
    cores = available_cores()
    if device.type == "cpu" and processes > cores:
        raise ConfigError(
            f"{parameter}={processes} starts {processes} training processes on the CPU, which has {cores} core(s) "
            f"here: they would take turns on the cores, slower than {cores} and holding {processes} copies of the "
            f"model. Set {parameter} to at most {cores} (or train on GPUs, one process each)."
        )
