"""The machine a benchmark's figures were measured on: the CPU's model and its fp32 and bf16 matmul rates, printed
beside every training figure (bf16 ran 1.65x fp32 on an AMD AVX512_BF16 CPU, 24x slower on an AVX2 one, 6x
faster on an Intel AMX one: a figure without them cannot be compared)."""

from __future__ import annotations

import time

import torch

from criteo_dlrm.engine.device import cpu_name as cpu_model
from criteo_dlrm.engine.device import matmul_rate

__all__ = ["cpu_model", "describe_machine", "matmul_gflops"]


def matmul_gflops(seconds: float = 1.0, dtype: torch.dtype = torch.float32) -> float:
    """This process's 2048^3 matmul rate, GFLOP/s, at its thread count."""
    return matmul_rate(dtype, seconds, size=2048)


def describe_machine() -> tuple[float, float]:
    """Print the CPU, torch, the threads and the fp32 and bf16 matmul rates; return the two rates (GFLOP/s)."""
    fp32, bf16 = matmul_gflops(), matmul_gflops(dtype=torch.bfloat16)
    print(
        f"CPU: {cpu_model()}; torch {torch.__version__}, {torch.get_num_threads()} threads; {time.strftime('%Y-%m-%d')}"
    )
    print(f"matmul 2048x2048: fp32 {fp32:,.0f} GFLOP/s, bf16 {bf16:,.0f} GFLOP/s ({bf16 / fp32:.2f}x fp32)\n")
    return fp32, bf16
