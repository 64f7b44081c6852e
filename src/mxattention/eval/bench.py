"""Time attention methods against torch SDPA on the available device, in one run.

Ratios are against torch SDPA (same dtype, same device) measured in the same process. On CUDA
this times the fused kernels where the dispatcher uses them; on the CPU the PyTorch reference.
`plan_methods` gives each method's kernel plan of the case (`mxattention bench --plan`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch

from mxattention.attention.config import get_method
from mxattention.kernels.plan import KernelPlan, kernel_plan
from mxattention.ops import scaled_dot_product_attention


def _time(fn, repeat: int, device: torch.device) -> float:
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(repeat):
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        return statistics.median(times)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_methods(
    shape: Sequence[int],
    methods: Sequence[str],
    *,
    device: str | None = None,
    dtype: torch.dtype = torch.bfloat16,
    repeat: int = 3,
) -> list[dict]:
    """Rows {name, ms, tflops, vs_sdpa} for torch SDPA and each method at [B, H, L, D] `shape`."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    b, h, length, d = shape
    g = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(b, h, length, d, generator=g).to(dev, dtype) for _ in range(3))
    flops = 4.0 * b * h * length * length * d
    cases = {"torch sdpa": lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)}
    for m in methods:
        cases[m] = lambda m=m: scaled_dot_product_attention(q, k, v, method=m)
    rows = []
    for name, fn in cases.items():
        t = _time(fn, repeat, dev)
        rows.append({"name": name, "ms": t * 1e3, "tflops": flops / t / 1e12})
    base = rows[0]["ms"]
    for r in rows:
        r["vs_sdpa"] = base / r["ms"]
    return rows


def plan_methods(
    shape: Sequence[int],
    methods: Sequence[str],
    *,
    device: str | None = None,
    dtype: torch.dtype = torch.bfloat16,
) -> list[KernelPlan]:
    """The kernel plan (`kernels.plan.kernel_plan`, what `scaled_dot_product_attention` executes) of
    each method on [B, H, L, D] `shape` inputs on `device` (uninitialized tensors: a plan reads shapes,
    strides and the device, not values)."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    q = torch.empty(tuple(shape), device=dev, dtype=dtype)
    return [kernel_plan(get_method(m), q, q, q, shape[-1] ** -0.5) for m in methods]
