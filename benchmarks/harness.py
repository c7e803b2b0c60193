"""What every benchmark shares: its arguments (``--smallest`` runs it at the size the test suite runs it, the
sizes written beside its parser), the machine its figures were measured on (the CPU's model and its fp32 and
bf16 matmul rates: bf16 ran 1.65x fp32 on an AMD AVX512_BF16 CPU, 24x slower on an AVX2 one, 6x faster on an
Intel AMX one, so a figure without them cannot be compared), measured runs, and its Markdown tables.

Benchmarks are modules of this package, run from the project's root: ``python -m benchmarks.<name>``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# A ``--smallest`` run proves that the benchmark works; its figures are not compared, so the machine's matmul rates
# are measured on small products: one 2048^3 bf16 product takes 73 s on an AVX2 CPU (0.235 GFLOP/s), which made
# every benchmark's smallest run in the test suite take 145 s.
_SMALLEST = False
SMALLEST_MATMUL = 256

__all__ = ["ROOT", "Arguments", "Table", "best_of", "child_command", "cpu_model", "describe_machine",
           "timed"]  # fmt: skip


class Arguments(argparse.ArgumentParser):
    """A benchmark's command line: its module docstring as the help, and ``--smallest``, which runs it with
    ``smallest`` (its smallest sizes, the run the test suite makes of every benchmark) before any other arguments
    given. ``smallest`` None: a benchmark the tests do not run (a quality study trains to convergence)."""

    def __init__(self, doc: str | None, smallest: Sequence[str] | None):
        main = getattr(sys.modules["__main__"], "__spec__", None)
        prog = f"python -m {main.name}" if main is not None else None  # how it is run, in its usage line
        super().__init__(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
        self.smallest = list(smallest or [])
        if smallest is not None:
            self.add_argument(
                "--smallest", action="store_true", help=f"the smallest run, as the tests make it: {' '.join(smallest)}"
            )

    def parse_args(self, args: Sequence[str] | None = None, namespace=None):  # type: ignore[override]
        global _SMALLEST
        given = sys.argv[1:] if args is None else list(args)
        if "--smallest" in given:
            given = [*self.smallest, *given]
            _SMALLEST = True
        return super().parse_args(given, namespace)


def child_command(module: str, *args: str) -> list[str]:
    """The command that runs benchmark ``module`` (``__spec__.name``: ``benchmarks.<name>``) in a fresh process: it
    finds this package as its parent did (the project's root as the working folder, or on ``PYTHONPATH``)."""
    return [sys.executable, "-m", module, *args]


class Table:
    """A Markdown table printed a row at a time (a long benchmark shows its figures as they come).

    Args:
        columns: the header's names.
        align: ``l`` or ``r`` per column; by default the first column left, the others (figures) right.
    """

    def __init__(self, *columns: str, align: str | None = None):
        align = align or "l" + "r" * (len(columns) - 1)
        if len(align) != len(columns):
            raise ValueError(f"{len(columns)} columns but alignment {align!r}")
        self.columns = len(columns)
        print("| " + " | ".join(columns) + " |")
        print("| " + " | ".join("---:" if a == "r" else "---" for a in align) + " |", flush=True)

    def row(self, *cells: Any) -> None:
        if len(cells) != self.columns:
            raise ValueError(f"{len(cells)} cells in a table of {self.columns} columns")
        # A "|" inside a cell (|difference|) would end it: escaped, as Markdown reads it.
        print("| " + " | ".join(str(cell).replace("|", "\\|") for cell in cells) + " |", flush=True)


def timed(work: Callable[[], Any]) -> float:
    """Seconds ``work()`` took."""
    start = time.perf_counter()
    work()
    return time.perf_counter() - start


def best_of(repeats: int, work: Callable[[], Any]) -> float:
    """The fastest of ``repeats`` runs of ``work()``, in seconds: the least disturbed by the rest of the machine."""
    return min(timed(work) for _ in range(repeats))


# torch is imported where a rate is measured: a benchmark may set its threads before torch starts (threads.py).


def cpu_model() -> str:
    """The CPU's model name."""
    from criteo_dlrm.engine.device import cpu_name

    return cpu_name()


def describe_machine() -> tuple[float, float]:
    """Print the CPU, torch, the threads and the fp32 and bf16 matmul rates; return the two rates (GFLOP/s)."""
    import torch

    from criteo_dlrm.engine.device import matmul_rate

    size, seconds, note = (
        (SMALLEST_MATMUL, 0.25, " (--smallest: small products, not figures to compare)")
        if _SMALLEST
        else (2048, 1.0, "")
    )
    fp32, bf16 = (matmul_rate(dtype, seconds, size) for dtype in (torch.float32, torch.bfloat16))
    print(
        f"CPU: {cpu_model()}; torch {torch.__version__}, {torch.get_num_threads()} threads; {time.strftime('%Y-%m-%d')}"
    )
    print(f"matmul {size}x{size}{note}: fp32 {fp32:,.3g} GFLOP/s, bf16 {bf16:,.3g} GFLOP/s ({bf16 / fp32:.3g}x fp32)\n")
    return fp32, bf16
