"""Progress bars for long work: shown on a terminal, silent in logs and CI unless asked for."""

from __future__ import annotations

from tqdm import tqdm


def progress_bar(total: int | None, desc: str, unit: str, show: bool | None = None, **kwargs) -> tqdm:
    """A tqdm bar; ``show=None`` shows it only when the output is a terminal."""
    return tqdm(
        total=total, desc=desc, unit=unit, unit_scale=True, disable=None if show is None else not show, **kwargs
    )
