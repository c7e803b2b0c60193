"""torch.profiler around training steps, with traces for TensorBoard / Perfetto and a top-ops report."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from loguru import logger
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

TOP_OPS_REPORT = "profile_top_ops.txt"


@dataclass
class ProfilerSettings:
    """``training.profiler`` parameters (off by default)."""

    enabled: bool = False
    wait: int = 5
    warmup: int = 2
    active: int = 5
    repeat: int = 1
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = True
    row_limit: int = 30


class _NoProfiler:
    def step(self) -> None:
        pass


@contextlib.contextmanager
def profiler(settings: ProfilerSettings, run_dir: Path, device: torch.device) -> Iterator[profile | _NoProfiler]:
    """Yields an object whose ``step()`` is called after every training step.

    When enabled, traces (``*.pt.trace.json``) go to ``run_dir`` through the TensorBoard trace handler,
    and a table of the top operators by self time to ``run_dir/profile_top_ops.txt``.
    """
    if not settings.enabled:
        yield _NoProfiler()
        return
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    run_dir.mkdir(parents=True, exist_ok=True)
    with profile(
        activities=activities,
        schedule=schedule(wait=settings.wait, warmup=settings.warmup, active=settings.active, repeat=settings.repeat),
        on_trace_ready=tensorboard_trace_handler(str(run_dir)),
        record_shapes=settings.record_shapes,
        profile_memory=settings.profile_memory,
        with_stack=settings.with_stack,
    ) as prof:
        yield prof
    sort_by = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    try:
        table = prof.key_averages().table(sort_by=sort_by, row_limit=settings.row_limit)
    except (AssertionError, RuntimeError) as error:  # no profiled step (the run was shorter than wait + warmup)
        logger.warning("profiler recorded no step ({}); increase the run or lower profiler.wait", error)
        return
    (run_dir / TOP_OPS_REPORT).write_text(table)
    logger.info("profiler: traces and {} written to {}", TOP_OPS_REPORT, run_dir)
