"""The Universal-Optimal-Scaling boundary q* of a ladder: the root of Delta(q) = E(q) - 8 E(q/2).

Exposes `optimal_boundary(elem) -> float` (the correctly rounded root), `optimal_boundary_exact(elem)`
(the root as an exact `QuadraticRoot`), and `QuadraticRoot`.

Between two consecutive break points (knots of E(q) and of E(q/2)) the rounding targets a = Q(q) and
b = Q(q/2) are constant, and the cubic terms of E(q) - 8 E(q/2) cancel:
Delta(q) = (2b - a) q^2 + (a^2 - 4b^2) q + K. So q* is the root of a quadratic with rational
coefficients, r + s*sqrt(R), which we find exactly and round to float64 by exact comparisons.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from fractions import Fraction

from mxattention.formats.ladders import get_ladder
from mxattention.theory.error import Delta_exact, Ladder, error_knots


@dataclass(frozen=True)
class QuadraticRoot:
    """The exact number `rational + sign * sqrt(radicand)`, radicand >= 0 and sign in {-1, +1}."""

    rational: Fraction
    radicand: Fraction = Fraction(0)
    sign: int = 1

    @property
    def is_rational(self) -> bool:
        """True when the square root is rational, i.e. the number is a Fraction."""
        return _rational_sqrt(self.radicand) is not None

    def as_fraction(self) -> Fraction:
        """The value as a Fraction; ValueError when it is irrational."""
        root = _rational_sqrt(self.radicand)
        if root is None:
            raise ValueError(f"{self} is irrational")
        return self.rational + self.sign * root

    def compare(self, c: Fraction | int | float) -> int:
        """Sign of (self - c), computed exactly: -1, 0 or +1."""
        t = Fraction(c) - self.rational  # self - c = sign*sqrt(R) - t
        if self.sign < 0:
            t = -t  # sign*sqrt(R) - t  has the sign of  sign * (sqrt(R) - sign*t)
        if t < 0:
            diff = 1
        else:
            sq = t * t
            diff = (self.radicand > sq) - (self.radicand < sq)
        return diff * self.sign

    def __float__(self) -> float:
        """Correctly rounded float64 (round to nearest)."""
        root = _rational_sqrt(self.radicand)
        if root is not None:
            return float(self.rational + self.sign * root)  # Fraction -> float rounds correctly
        c = float(self.rational) + self.sign * math.sqrt(float(self.radicand))
        # An irrational root is never a tie: walking to the float whose rounding interval holds it is exact.
        while True:
            up, down = math.nextafter(c, math.inf), math.nextafter(c, -math.inf)
            if self.compare((Fraction(c) + Fraction(up)) / 2) > 0:
                c = up
            elif self.compare((Fraction(c) + Fraction(down)) / 2) < 0:
                c = down
            else:
                return c

    def __str__(self) -> str:
        if self.is_rational:
            return str(self.as_fraction())
        op = "+" if self.sign > 0 else "-"
        return f"{self.rational} {op} sqrt({self.radicand})"


def _rational_sqrt(x: Fraction) -> Fraction | None:
    n, d = x.numerator, x.denominator  # already in lowest terms
    rn, rd = math.isqrt(n), math.isqrt(d)
    return Fraction(rn, rd) if rn * rn == n and rd * rd == d else None


def _solve_quadratic(a2: Fraction, a1: Fraction, a0: Fraction) -> list[QuadraticRoot]:
    """Real roots of a2 q^2 + a1 q + a0 (a2 or a1 nonzero), exactly."""
    if a2 == 0:
        return [QuadraticRoot(-a0 / a1)]
    disc = a1 * a1 - 4 * a2 * a0
    if disc < 0:
        return []
    center, radicand = -a1 / (2 * a2), disc / (4 * a2 * a2)
    return [QuadraticRoot(center, radicand, -1), QuadraticRoot(center, radicand, 1)]


def _break_points(elem: Ladder, lo: Fraction, hi: Fraction) -> list[Fraction]:
    knots = error_knots(elem)
    pts = {lo, hi} | {k for k in knots if lo < k < hi} | {2 * k for k in knots if lo < 2 * k < hi}
    return sorted(pts)


def _roots_in_piece(elem: Ladder, lo: Fraction, hi: Fraction) -> list[QuadraticRoot]:
    ladder = get_ladder(elem)
    mid = (lo + hi) / 2
    a = _nearest(ladder.magnitudes, mid)
    b = _nearest(ladder.magnitudes, mid / 2)
    a2, a1 = 2 * b - a, a * a - 4 * b * b
    a0 = Delta_exact(mid, elem) - (a2 * mid * mid + a1 * mid)
    if a2 == 0 and a1 == 0:
        if a0 == 0:
            raise ArithmeticError(f"Delta of {ladder.name} vanishes on all of [{lo}, {hi}]")
        return []
    return [r for r in _solve_quadratic(a2, a1, a0) if r.compare(lo) > 0 and r.compare(hi) < 0]


def _nearest(magnitudes: tuple[float, ...], x: Fraction) -> Fraction:
    # Only called strictly inside a piece, so there are no ties to break.
    return min((Fraction(v) for v in magnitudes), key=lambda v: abs(v - x))


def optimal_boundary_exact(elem: Ladder = "e2m1") -> QuadraticRoot:
    """Exact root of Delta on (max/2, 2 max] (normalized-magnitude units of the ladder).

    Raises ArithmeticError unless Delta changes sign exactly once there, from negative to positive.
    """
    ladder = get_ladder(elem)
    top = Fraction(ladder.max_value)
    pts = _break_points(ladder, top / 2, 2 * top)
    roots = [QuadraticRoot(p) for p in pts[1:-1] if Delta_exact(p, ladder) == 0]
    for lo, hi in itertools.pairwise(pts):
        roots.extend(_roots_in_piece(ladder, lo, hi))
    if len(roots) != 1 or Delta_exact(pts[0], ladder) >= 0 or Delta_exact(pts[-1], ladder) <= 0:
        raise ArithmeticError(f"Delta of {ladder.name} has no unique sign change on (max/2, 2 max]")
    return roots[0]


def optimal_boundary(elem: Ladder = "e2m1") -> float:
    """q*: the boundary q minimizing J(q) for every phase density; 7.25 exactly for "e2m1"."""
    return float(optimal_boundary_exact(elem))
