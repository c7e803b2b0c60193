"""torch.profiler around training steps, with traces for TensorBoard / Perfetto and a top-ops report."""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from loguru import logger
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

from criteo_dlrm.common.storage import write_bytes_atomically
from criteo_dlrm.config.training import ProfilerConfig

TOP_OPS_REPORT = "profile_top_ops.txt"
TOP_OPS_HEADER = """\
Operators of the profiled training steps, by {sort_by} (time in the operator itself, not its children).
With profiler.with_stack on, Python functions are rows too: `threading.py(...): wait` (and `acquire`) is time a
thread spent blocked, waiting for another (the training thread for the next batch, a helper thread such as the
progress bar's for its next tick): waiting, not computing. Read the aten:: rows for where the compute goes;
set profiler.with_stack: false for operators only.

"""


# What the profiler's native code prints to stderr at every start and stop, for no reader.
_NATIVE_NOTES = ("USDT:", "STAGE:", "CPUAllocator.cpp")


class _NoProfiler:
    def step(self) -> None:
        pass


@contextlib.contextmanager
def _without_native_notes() -> Iterator[None]:
    """Run the block with the process's stderr (fd 2) captured, then pass on every line but kineto's notes."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            for line in captured.read().decode(errors="replace").splitlines(keepends=True):
                if not any(note in line for note in _NATIVE_NOTES):
                    sys.stderr.write(line)


class _QuietProfiler:
    """``torch.profiler.profile`` whose steps (where it starts and stops recording) print only what matters."""

    def __init__(self, prof: profile):
        self.prof = prof

    def step(self) -> None:
        with _without_native_notes():
            self.prof.step()


@contextlib.contextmanager
def profiler(config: ProfilerConfig, run_dir: Path, device: torch.device) -> Iterator[_QuietProfiler | _NoProfiler]:
    """Yields an object whose ``step()`` is called after every training step.

    When enabled, traces (``*.pt.trace.json``) go to ``run_dir`` through the TensorBoard trace handler,
    and a table of the top operators by self time to ``run_dir/profile_top_ops.txt``.
    """
    if not config.enabled:
        yield _NoProfiler()
        return
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    run_dir.mkdir(parents=True, exist_ok=True)
    prof = profile(
        activities=activities,
        schedule=schedule(wait=config.wait, warmup=config.warmup, active=config.active, repeat=config.repeat),
        on_trace_ready=tensorboard_trace_handler(str(run_dir)),
        record_shapes=config.record_shapes,
        profile_memory=config.profile_memory,
        with_stack=config.with_stack,
    )
    with _without_native_notes():
        prof.__enter__()
    try:
        yield _QuietProfiler(prof)
    finally:
        with _without_native_notes():
            prof.__exit__(None, None, None)
    sort_by = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    try:
        table = prof.key_averages().table(sort_by=sort_by, row_limit=config.row_limit)
    except (AssertionError, RuntimeError) as error:  # no profiled step (the run was shorter than wait + warmup)
        logger.warning("profiler recorded no step ({}); increase the run or lower profiler.wait", error)
        return
    write_bytes_atomically(run_dir / TOP_OPS_REPORT, (TOP_OPS_HEADER.format(sort_by=sort_by) + table).encode())
    logger.info("profiler: traces and {} written to {}", TOP_OPS_REPORT, run_dir)
