"""A child process that ends with its parent, from its first instruction (standard library only, so it is set
before anything slow is imported).

A training process started by ``kedro run`` imports torch and waits for the run's rendezvous store: a parent
killed at that moment (``kill -9``, a scheduler's memory limit) left it running for 300 s or more. The kernel's
parent-death signal (Linux) ends it at once; elsewhere it is not set, and the child ends when its group fails.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def end_with_parent(parent: int) -> None:
    """SIGKILL this process when its parent (the thread that started it) ends; exit now when ``parent``, the
    process that started it, has ended already (before the signal was set)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            error = ctypes.get_errno()
            raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")
    if os.getppid() != parent:
        os._exit(1)
