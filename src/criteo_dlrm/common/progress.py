"""Progress of long work: a bar on a terminal; in a log (a batch job's, CI's), a plain line at a steady interval.

A job's log file gets no bar (tqdm draws with carriage returns), but an encoding pass or a training epoch can
last hours at Criteo 1TB's size: off a terminal the same tqdm writes one status line every
``CRITEO_DLRM_PROGRESS_SECONDS`` (30 by default) through the project's logger: what is done, the rate and the
time left, and the loss and samples/s where the work sets them.
"""

from __future__ import annotations

import os
import sys

from loguru import logger
from tqdm import tqdm

PROGRESS_SECONDS = "CRITEO_DLRM_PROGRESS_SECONDS"
_LINE = "{desc}: {n_fmt}/{total_fmt}{unit} ({percentage:.0f}%), {rate_fmt}, {remaining} left{postfix}"
_OPEN_LINE = "{desc}: {n_fmt}{unit}, {rate_fmt}{postfix}"  # no total known


class _LogLines:
    """A file for tqdm that logs each status it writes as one line (tqdm's carriage returns dropped)."""

    def write(self, text: str) -> None:
        line = text.strip("\r\n ")
        if line:
            logger.info(line)

    def flush(self) -> None:
        pass


def progress_bar(total: int | None, desc: str, unit: str, show: bool | None = None, **kwargs) -> tqdm:
    """A tqdm bar. ``show=None``: a bar on a terminal, else a logged line every ``CRITEO_DLRM_PROGRESS_SECONDS``;
    ``show=False``: nothing (another process reports it); ``show=True``: a bar."""
    if show is None and not sys.stderr.isatty():
        seconds = float(os.environ.get(PROGRESS_SECONDS, 30))
        # delay: nothing for work shorter than one interval; leave=False: no repeat of the last line at the end
        # (the stage logs its own summary).
        return tqdm(
            total=total, desc=desc, unit=f" {unit}", unit_scale=True, file=_LogLines(), mininterval=seconds,
            maxinterval=max(seconds, 10), miniters=1, delay=seconds, leave=False, ascii=True,
            bar_format=_LINE if total else _OPEN_LINE, disable=False, **kwargs,
        )  # fmt: skip
    return tqdm(
        total=total, desc=desc, unit=unit, unit_scale=True, disable=None if show is None else not show, **kwargs
    )
