"""Per-tensor oracle sweep of the MX boundary q (the paper's Table 4)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from mxattention.formats.mx import fake_quantize


def q_grid(start: float = 6.0, stop: float = 8.0, step: float = 0.05) -> list[float]:
    """The sweep grid, rounded to the step's decimals so 7.25 is exactly 7.25."""
    n = round((stop - start) / step)
    return [round(start + i * step, 10) for i in range(n + 1)]


@dataclass(frozen=True)
class QSweep:
    grid: list[float]
    mse: list[float]  # MSE of the tensor under ceil rule q, per grid point
    best_q: float
    mse_ocp: float
    mse_uos: float

    @property
    def uos_gap(self) -> float:
        """MSE(7.25) / MSE(best q) - 1: how far UOS is from this tensor's oracle."""
        return self.mse_uos / min(self.mse) - 1.0


def q_sweep(x: torch.Tensor, axis: int = -1, grid: list[float] | None = None) -> QSweep:
    """MSE of MXFP4 quantization of `x` along `axis` for each ceil boundary q of `grid`."""
    grid = grid or q_grid()
    xf = x.float()
    denom = xf.numel()

    def mse(rule) -> float:
        return float(((fake_quantize(xf, axis, rule=rule) - xf) ** 2).sum() / denom)

    errs = [mse(q) for q in grid]
    best = grid[min(range(len(grid)), key=errs.__getitem__)]
    return QSweep(grid, errs, best, mse("ocp"), mse("uos"))


def sweep_histogram(best_qs: list[float]) -> dict[str, float]:
    """Share (percent) of tensors whose optimum is <= 7.15, 7.20, 7.25, >= 7.30 (Table 4's bins)."""
    bins: Counter[str] = Counter()
    for q in best_qs:
        if q <= 7.15 + 1e-9:
            bins["<=7.15"] += 1
        elif abs(q - 7.20) < 1e-9:
            bins["7.20"] += 1
        elif abs(q - 7.25) < 1e-9:
            bins["7.25"] += 1
        else:
            bins[">=7.30"] += 1
    n = max(1, len(best_qs))
    return {k: 100.0 * bins[k] / n for k in ("<=7.15", "7.20", "7.25", ">=7.30")}
