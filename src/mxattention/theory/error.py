"""Projection error of a saturating element ladder: E(x), D(x) = E(x)/x^3, Delta(q) = E(q) - 8 E(q/2).

Exposes `E`, `D`, `Delta` (float64, vectorised over numpy arrays), their exact counterparts
`E_exact`, `D_exact`, `Delta_exact` (`fractions.Fraction` in, `Fraction` out), and `error_knots(elem)`,
the points where E stops being one cubic polynomial (the rounding midpoints of the ladder).

E(x) = integral_0^x (t - Q(t))^2 dt, Q = round to nearest on the ladder G+, saturating at its max.
All quantities are in units of the block scale (x is a normalized magnitude). Between two consecutive
midpoints Q(t) is one ladder value g, so E is an exact piecewise cubic; beyond the last midpoint
Q(t) = max, which is what saturation means for t > max as well.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction
from functools import cache

import numpy as np
import numpy.typing as npt

from mxattention.formats.ladders import ElementLadder, get_ladder

Ladder = str | ElementLadder
ArrayLike = npt.ArrayLike
Exact = Fraction | int


@dataclass(frozen=True)
class _Cells:
    """Rounding cells of one ladder: cell k is [low[k], low[k+1]) and rounds to value[k]."""

    knots: tuple[Fraction, ...]  # midpoints between consecutive ladder values, ascending
    low: tuple[Fraction, ...]  # left end of each cell: 0 then the knots
    value: tuple[Fraction, ...]  # ladder value each cell rounds to
    e_low: tuple[Fraction, ...]  # E at each cell's left end
    knots_f: np.ndarray
    low_f: np.ndarray
    value_f: np.ndarray
    e_low_f: np.ndarray


@cache
def _cells(ladder: ElementLadder) -> _Cells:
    # Ladder values are dyadic floats, so Fraction(float) is exact and so is everything built from them.
    vals = [Fraction(v) for v in ladder.magnitudes]
    knots = [(a + b) / 2 for a, b in itertools.pairwise(vals)]
    low = [Fraction(0), *knots]
    e_low = [Fraction(0)]
    for k in range(len(knots)):
        e_low.append(e_low[-1] + _cell_integral(low[k], low[k + 1], vals[k]))
    return _Cells(
        tuple(knots),
        tuple(low),
        tuple(vals),
        tuple(e_low),
        _floats(knots),
        _floats(low),
        _floats(vals),
        _floats(e_low),
    )


def _floats(xs: list[Fraction]) -> np.ndarray:
    return np.array([float(v) for v in xs], dtype=np.float64)


def _cell_integral(a: Fraction, b: Fraction, g: Fraction) -> Fraction:
    return ((b - g) ** 3 - (a - g) ** 3) / 3


def error_knots(elem: Ladder = "e2m1") -> tuple[Fraction, ...]:
    """Rounding midpoints of the ladder (exact), ascending: E is one cubic between consecutive knots."""
    return _cells(get_ladder(elem)).knots


def _as_fraction(x: Exact | float, name: str) -> Fraction:
    if isinstance(x, bool) or not isinstance(x, (Fraction, int, float)):
        raise TypeError(f"{name} must be a Fraction, int or float, got {type(x).__name__}")
    fx = Fraction(x)
    if fx < 0:
        raise ValueError(f"{name} must be >= 0, got {x}")
    return fx


def E_exact(x: Exact | float, elem: Ladder = "e2m1") -> Fraction:
    """Exact E(x) = integral_0^x (t - Q(t))^2 dt for a magnitude x >= 0 (floats are read exactly)."""
    fx = _as_fraction(x, "x")
    c = _cells(get_ladder(elem))
    k = _cell_index_exact(c.knots, fx)
    return c.e_low[k] + _cell_integral(c.low[k], fx, c.value[k])


def _cell_index_exact(knots: tuple[Fraction, ...], x: Fraction) -> int:
    lo, hi = 0, len(knots)
    while lo < hi:  # number of knots <= x, i.e. bisect_right
        mid = (lo + hi) // 2
        if knots[mid] <= x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def D_exact(x: Exact | float, elem: Ladder = "e2m1") -> Fraction:
    """Exact D(x) = E(x) / x^3 for x > 0 (relative mean squared error of U[0, x] magnitudes)."""
    fx = _as_fraction(x, "x")
    if fx == 0:
        raise ValueError("D_exact needs x > 0 (the limit at 0 is 1/3)")
    return E_exact(fx, elem) / fx**3


def Delta_exact(q: Exact | float, elem: Ladder = "e2m1") -> Fraction:
    """Exact Delta(q) = E(q) - 8 E(q/2); its sign is the sign of J'(q) for every density."""
    fq = _as_fraction(q, "q")
    return E_exact(fq, elem) - 8 * E_exact(fq / 2, elem)


def _as_array(x: ArrayLike, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if np.any(np.isnan(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must be >= 0 and not NaN")
    return arr


def _result(arr: np.ndarray) -> np.ndarray | float:
    return float(arr) if arr.ndim == 0 else arr


def E(x: ArrayLike, elem: Ladder = "e2m1") -> np.ndarray | float:
    """E(x) in float64 for magnitudes x >= 0 (any shape); a float for a scalar x."""
    arr = _as_array(x, "x")
    c = _cells(get_ladder(elem))
    k = np.searchsorted(c.knots_f, arr, side="right")
    g = c.value_f[k]
    out = c.e_low_f[k] + ((arr - g) ** 3 - (c.low_f[k] - g) ** 3) / 3.0
    return _result(out)


def D(x: ArrayLike, elem: Ladder = "e2m1") -> np.ndarray | float:
    """D(x) = E(x) / x^3 in float64 for x >= 0, with its limit 1/3 at x = 0 (Q rounds to 0 there)."""
    arr = _as_array(x, "x")
    positive = arr > 0
    safe = np.where(positive, arr, 1.0)
    out = np.where(positive, np.asarray(E(safe, elem)) / safe**3, 1.0 / 3.0)
    return _result(out)


def Delta(q: ArrayLike, elem: Ladder = "e2m1") -> np.ndarray | float:
    """Delta(q) = E(q) - 8 E(q/2) in float64 for q >= 0 (any shape)."""
    arr = _as_array(q, "q")
    return _result(np.asarray(E(arr, elem)) - 8.0 * np.asarray(E(arr / 2.0, elem)))
