"""J(q): accuracy of the quadrature, minimum at 7.25 for every density, J' has the sign of Delta."""

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from mxattention.formats.ladders import LADDERS, get_ladder
from mxattention.theory import (
    D,
    Delta,
    E_exact,
    J,
    J_prime,
    brute_force_boundary,
    default_grid,
    error_knots,
    figure_densities,
    g,
    optimal_boundary,
)

GRID = np.round(6.0 + 0.05 * np.arange(41), 2)  # 6.00 .. 8.00 step 0.05, as in the paper
NON_UNIFORM = {k: v for k, v in figure_densities().items() if k != "log-uniform"}


def _j_loguniform_closed_form(q: float, name: str) -> float:
    """Antiderivative of (c0 + c1 x + c2 x^2 + c3 x^3) / (x^4 ln 2) on each cubic piece of E."""
    lo = Fraction(q) / 2
    pts = sorted({lo, Fraction(q)} | {k for k in error_knots(name) if lo < k < q})
    total = 0.0
    for a, b in itertools.pairwise(pts):
        xs = [a + (b - a) * i / 3 for i in range(4)]
        # E restricted to [a, b] is a cubic: recover its coefficients exactly from 4 exact values.
        vand = [[x**k for k in range(4)] for x in xs]
        c = _solve(vand, [E_exact(x, name) for x in xs])
        fa, fb = float(a), float(b)
        total += (
            float(c[0]) * (fa**-3 - fb**-3) / 3
            + float(c[1]) * (fa**-2 - fb**-2) / 2
            + float(c[2]) * (1 / fa - 1 / fb)
            + float(c[3]) * math.log(fb / fa)
        )
    return total / math.log(2.0)


def _solve(m, rhs):
    n = len(rhs)
    aug = [[*row, r] for row, r in zip(m, rhs, strict=True)]
    for i in range(n):
        p = next(r for r in range(i, n) if aug[r][i] != 0)
        aug[i], aug[p] = aug[p], aug[i]
        for r in range(n):
            if r != i:
                f = aug[r][i] / aug[i][i]
                aug[r] = [x - f * y for x, y in zip(aug[r], aug[i], strict=True)]
    return [aug[i][n] / aug[i][i] for i in range(n)]


@pytest.mark.parametrize(
    "name,q", [("e2m1", 6.3), ("e2m1", 7.25), ("e2m1", 8.0), ("e3m2", 30.5), ("e4m3", 470.0)]
)
def test_quadrature_matches_closed_form(name, q):
    assert J(q, name) == pytest.approx(_j_loguniform_closed_form(q, name), rel=1e-12)


def test_quadrature_matches_scipy_for_non_uniform_densities():
    quad = pytest.importorskip("scipy.integrate").quad
    for d in NON_UNIFORM.values():
        for q in (6.4, 7.25, 7.9):
            ref, _ = quad(
                lambda x, d=d: D(x) * g(x, d), q / 2, q, points=[3.5, 5.0, 7.0], epsrel=1e-13, limit=400
            )
            assert J(q, "e2m1", d) == pytest.approx(ref, rel=1e-10)


def test_monte_carlo_with_real_rounding_matches_J():
    rng = np.random.default_rng(0)
    lad = np.array(get_ladder("e2m1").magnitudes)
    for q in (6.0, 7.25, 8.0):
        x = q / 2 * 2.0 ** rng.random(400_000)  # log-uniform block max in (q/2, q]
        t = x * rng.random(x.size)  # magnitudes uniform on [0, x]
        qt = lad[np.argmin(np.abs(t[:, None] - lad[None, :]), axis=1)]
        err = (t - qt) ** 2 / x**2
        assert abs(err.mean() - J(q)) < 5 * err.std() / math.sqrt(err.size)


def test_loguniform_minimum_on_paper_grid_is_7_25():
    vals = J(GRID)
    assert GRID[np.argmin(vals)] == 7.25
    assert np.sum(vals == vals.min()) == 1


@pytest.mark.parametrize("name", sorted(NON_UNIFORM))
def test_universality_every_density_minimized_at_7_25(name):
    d = NON_UNIFORM[name]
    assert brute_force_boundary("e2m1", d, GRID, rtol=0.0) == 7.25
    assert brute_force_boundary("e2m1", d) == pytest.approx(7.25, abs=default_grid()[1] - default_grid()[0])


@pytest.mark.parametrize("name", sorted(figure_densities()))
def test_J_prime_is_derivative_and_has_sign_of_delta(name):
    d = figure_densities()[name]
    qs = np.linspace(3.2, 11.8, 87)
    h = 1e-5
    fd = (np.asarray(J(qs + h, "e2m1", d)) - np.asarray(J(qs - h, "e2m1", d))) / (2 * h)
    jp = np.asarray(J_prime(qs, "e2m1", d))
    np.testing.assert_allclose(fd, jp, rtol=1e-4, atol=1e-9)
    assert np.array_equal(np.sign(jp), np.sign(np.asarray(Delta(qs))))


@pytest.mark.parametrize("name", sorted(LADDERS))
def test_brute_force_agrees_with_exact_boundary(name):
    grid = default_grid(name, points=1501)
    step = grid[1] - grid[0]
    assert abs(brute_force_boundary(name, grid=grid) - optimal_boundary(name)) <= step


def test_bad_arguments():
    with pytest.raises(ValueError, match="q > 0"):
        J(0.0)
    with pytest.raises(ValueError, match="grid"):
        brute_force_boundary(grid=[])
