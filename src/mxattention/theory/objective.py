"""The UOS objective J(q) = integral_{q/2}^{q} D(x) g(x) dx and its brute-force minimizer.

Exposes `J`, `J_prime` (the closed form g(q) (D(q) - D(q/2))), `brute_force_boundary` and
`default_grid`. J is the expected relative squared error of a block whose max is normalized into
(q/2, q] (units: block max squared); quadrature is composite Gauss-Legendre split at the ladder's
rounding midpoints (where D is not smooth) and at 1/32-octave steps (so narrow densities are resolved),
which is accurate to ~1e-14 relative here and needs no scipy.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from mxattention.formats.ladders import get_ladder
from mxattention.theory.densities import LogUniform, PhaseDensity, g
from mxattention.theory.error import D, Ladder, error_knots

_NODES, _WEIGHTS = np.polynomial.legendre.leggauss(16)
_PANELS_PER_OCTAVE = 32


def _j_one(q: float, elem: Ladder, density: PhaseDensity, knots: np.ndarray) -> float:
    lo = 0.5 * q
    inner = knots[(knots > lo) & (knots < q)]
    edges = np.union1d(lo * 2.0 ** np.linspace(0.0, 1.0, _PANELS_PER_OCTAVE + 1), inner)
    edges[-1] = q  # lo * 2.0**1 is q exactly, but keep the end point free of any rounding
    a, b = edges[:-1, None], edges[1:, None]
    x = 0.5 * (b - a) * _NODES + 0.5 * (a + b)
    vals = np.asarray(D(x, elem)) * g(x, density)
    return float(np.sum(0.5 * (b - a) * (vals @ _WEIGHTS[:, None])))


def J(q: npt.ArrayLike, elem: Ladder = "e2m1", density: PhaseDensity | None = None) -> np.ndarray | float:
    """J(q) for boundaries q > 0 (any shape; a float for a scalar q). density defaults to log-uniform."""
    dens = LogUniform() if density is None else density
    qq = np.asarray(q, dtype=np.float64)
    if np.any(~(qq > 0)) or not np.all(np.isfinite(qq)):
        raise ValueError("J needs finite boundaries q > 0")
    knots = np.array([float(k) for k in error_knots(elem)])
    out = np.array([_j_one(float(v), elem, dens, knots) for v in qq.ravel()]).reshape(qq.shape)
    return float(out) if out.ndim == 0 else out


def J_prime(
    q: npt.ArrayLike, elem: Ladder = "e2m1", density: PhaseDensity | None = None
) -> np.ndarray | float:
    """dJ/dq = g(q) (D(q) - D(q/2)), using g(q/2) = 2 g(q) (1-periodic H); same sign as Delta(q)."""
    dens = LogUniform() if density is None else density
    qq = np.asarray(q, dtype=np.float64)
    out = g(qq, dens) * (np.asarray(D(qq, elem)) - np.asarray(D(qq / 2.0, elem)))
    return float(out) if out.ndim == 0 else out


def default_grid(elem: Ladder = "e2m1", points: int = 3001) -> np.ndarray:
    """Evenly spaced boundaries over [max/2, 2 max] of the ladder (where optimal_boundary searches)."""
    top = get_ladder(elem).max_value
    return np.linspace(0.5 * top, 2.0 * top, points)


def brute_force_boundary(
    elem: Ladder = "e2m1",
    density: PhaseDensity | None = None,
    grid: npt.ArrayLike | None = None,
    rtol: float = 1e-12,
) -> float:
    """The grid point minimizing J: an independent check of optimal_boundary (grid defaults to default_grid).

    Points whose J is within rtol (relative) of the grid minimum count as ties and the largest wins.
    Why: for the self-similar wide ladders J is flat below q* far beyond float64 resolution (for E5M2,
    Delta = -2**-47 on (max/2, q*), so J changes by ~1e-21 relative there), and an exact tie-free argmin
    would return float noise; J rises measurably just above q*, so the largest tie is the resolvable answer.
    """
    qs = default_grid(elem) if grid is None else np.asarray(grid, dtype=np.float64).ravel()
    if qs.size == 0:
        raise ValueError("grid must hold at least one boundary")
    if not rtol >= 0:
        raise ValueError(f"rtol must be >= 0, got {rtol}")
    vals = np.asarray(J(qs, elem, density), dtype=np.float64).ravel()
    best = vals.min()
    return float(qs[vals <= best + rtol * abs(best)].max())
