"""Per-tensor oracle sweep of the MX boundary q (the paper's Table 4)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from mxattention.formats.ladders import get_ladder
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
        """MSE(UOS) / MSE(best q) - 1: how far UOS (7.25 for E2M1) is from this tensor's oracle."""
        return self.mse_uos / min(self.mse) - 1.0


def ladder_q_grid(elem: str = "e2m1", steps: int = 40) -> list[float]:
    """`steps` + 1 boundaries from the ladder's max to 2**(emax + 1), where q lives (6.00..8.00 step
    0.05 for E2M1; E4M3 448..512 step 1.6); each ladder's UOS boundary is on or next to a point."""
    lad = get_ladder(elem)
    lo, hi = lad.max_value, 2.0 ** (lad.emax + 1)
    return [round(lo + i * (hi - lo) / steps, 10) for i in range(steps + 1)]


def q_sweep(x: torch.Tensor, axis: int = -1, grid: list[float] | None = None, elem: str = "e2m1") -> QSweep:
    """MSE of MX quantization (element ladder `elem`) of `x` along `axis` for each ceil boundary q
    of `grid` (default `ladder_q_grid(elem)`, for E2M1 the same points as `q_grid()`)."""
    grid = grid or ladder_q_grid(elem)
    xf = x.float()
    denom = xf.numel()

    def mse(rule) -> float:
        return float(((fake_quantize(xf, axis, rule=rule, elem=elem) - xf) ** 2).sum() / denom)

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
