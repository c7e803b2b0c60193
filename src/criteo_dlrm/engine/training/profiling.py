"""torch.profiler around training steps, with traces for TensorBoard / Perfetto and a top-ops report."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
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


# What the profiler's native code prints to stderr, for no reader: at every start and stop, and while it records
# (a tensor made before it started and freed while it records, with profile_memory).
_NATIVE_NOTES = (b"USDT:", b"STAGE:", b"CPUAllocator.cpp")


class _NoProfiler:
    def step(self) -> None:
        pass


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


def _pass_on(source: int, destination: int) -> None:
    """Copy ``source`` to ``destination`` as it comes, line by line (a progress bar's carriage returns end a line
    too), but the profiler's native notes; close both at the end of ``source``."""
    pending = b""
    try:
        while chunk := os.read(source, 1 << 16):
            *lines, pending = re.split(rb"(?<=[\n\r])", pending + chunk)
            _write_all(destination, b"".join(line for line in lines if not any(n in line for n in _NATIVE_NOTES)))
        if pending and not any(note in pending for note in _NATIVE_NOTES):
            _write_all(destination, pending)
    finally:
        os.close(source)
        os.close(destination)


@contextlib.contextmanager
def _without_native_notes() -> Iterator[None]:
    """Run the block with the process's stderr (fd 2: torch's C++ writes there, beside Python's logs and progress
    bars) passed on as it comes through a thread that drops the profiler's native notes."""
    sys.stderr.flush()
    saved = os.dup(2)
    source, sink = os.pipe()
    os.dup2(sink, 2)
    os.close(sink)
    thread = threading.Thread(target=_pass_on, args=(source, saved), name="profiler-stderr", daemon=True)
    thread.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)  # the pipe's last writer here closed: the thread ends once it has passed on the rest
        thread.join(timeout=10)  # a process started meanwhile may hold the pipe: the thread then ends with it


@contextlib.contextmanager
def profiler(config: ProfilerConfig, run_dir: Path, device: torch.device) -> Iterator[profile | _NoProfiler]:
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
    with _without_native_notes(), prof:
        yield prof
    sort_by = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    try:
        table = prof.key_averages().table(sort_by=sort_by, row_limit=config.row_limit)
    except (AssertionError, RuntimeError) as error:  # no profiled step (the run was shorter than wait + warmup)
        logger.warning("profiler recorded no step ({}); increase the run or lower profiler.wait", error)
        return
    write_bytes_atomically(run_dir / TOP_OPS_REPORT, (TOP_OPS_HEADER.format(sort_by=sort_by) + table).encode())
    logger.info("profiler: traces and {} written to {}", TOP_OPS_REPORT, run_dir)
