"""Device choice and the CUDA switches (TF32, bf16 autocast), decided once from parameters."""

from __future__ import annotations

import contextlib
import os

import torch

from criteo_dlrm.common.errors import ConfigError

PRECISIONS = ("fp32", "bf16")


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
            raise ConfigError(
                f"{parameter} is {name!r} but this machine has no usable CUDA device "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}). Use --params={parameter}=auto or cpu."
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"{parameter} is {name!r} but only {torch.cuda.device_count()} CUDA device(s) exist.")
    elif device.type != "cpu":
        raise ConfigError(f"{parameter} {name!r} is not supported: use auto, cpu, cuda or cuda:N")
    return device


def default_threads() -> int:
    """PyTorch's CPU threads when ``num_threads`` is null (measured: benchmarks/threads.py)."""
    return os.cpu_count() or 1


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
    for name in ("bottom_mlp", "top_mlp"):
        getattr(model, name).compile(mode=mode)
    return model
