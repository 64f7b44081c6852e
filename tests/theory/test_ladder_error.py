"""E, D, Delta: exact values, float/exact agreement, and an independent brute-force integral."""

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mxattention.formats.ladders import LADDERS, get_ladder
from mxattention.theory import D, D_exact, Delta, Delta_exact, E, E_exact, error_knots


def _nearest(t: np.ndarray, name: str) -> np.ndarray:
    lad = np.array(get_ladder(name).magnitudes)
    return lad[np.argmin(np.abs(t[:, None] - lad[None, :]), axis=1)]


def test_e2m1_exact_values():
    assert E_exact(6) == Fraction(7, 8)
    assert E_exact(5) == Fraction(13, 24)
    assert E_exact(Fraction(6), "e2m1") == Fraction(7, 8)
    assert E(6.0) == 0.875
    assert D_exact(6) == Fraction(7, 8) / 216


@pytest.mark.parametrize(
    "q", [Fraction(21, 2), Fraction(11), Fraction(101, 7), Fraction(50), Fraction(1000, 3)]
)
def test_delta_closed_form_beyond_ten(q):
    assert Delta_exact(q) == (48 * q**2 - 864 * q + 3983) / 8


@pytest.mark.parametrize("name", sorted(LADDERS))
def test_float_path_matches_exact(name):
    top = get_ladder(name).max_value
    xs = np.concatenate([np.linspace(0, 2.5 * top, 997), [float(k) for k in error_knots(name)]])
    exact = np.array([float(E_exact(float(x), name)) for x in xs])
    np.testing.assert_allclose(E(xs, name), exact, rtol=1e-12, atol=0)
    qs = xs[xs > 0]
    np.testing.assert_allclose(D(qs, name), [float(D_exact(float(x), name)) for x in qs], rtol=1e-12)


@pytest.mark.parametrize("name", ["e2m1", "e3m2"])
def test_E_matches_midpoint_rule_with_real_rounding(name):
    top = get_ladder(name).max_value
    for x in (0.3 * top, 0.77 * top, top, 1.3 * top):
        n = 400_000
        t = (np.arange(n) + 0.5) * (x / n)
        brute = np.sum((t - _nearest(t, name)) ** 2) * (x / n)
        assert E(x, name) == pytest.approx(brute, rel=1e-6)


def test_beyond_max_error_grows_as_cube():
    for name in LADDERS:
        top = Fraction(get_ladder(name).max_value)
        for extra in (Fraction(1, 3), top / 5, top):
            assert E_exact(top + extra, name) == E_exact(top, name) + extra**3 / 3


@settings(max_examples=60, deadline=None)
@given(x=st.floats(0, 20), y=st.floats(0, 20))
def test_E_increasing_and_bounded_by_no_quantization_error(x, y):
    lo, hi = sorted((x, y))
    assert E_exact(lo) <= E_exact(hi)
    assert E_exact(hi) <= Fraction(hi) ** 3 / 3  # |t - Q(t)| <= t since 0 is on the ladder


def test_delta_sign_around_7_25():
    q0 = Fraction(29, 4)
    assert Delta_exact(q0) == 0
    for eps in (Fraction(1, 10**9), Fraction(1, 1000), Fraction(1, 10)):
        assert Delta_exact(q0 - eps) < 0 < Delta_exact(q0 + eps)
    below = np.linspace(3, 7.25, 400)[1:-1]
    above = np.linspace(7.25, 12, 400)[1:]
    assert all(Delta_exact(float(q)) < 0 for q in below)
    assert all(Delta_exact(float(q)) > 0 for q in above)
    assert np.all(np.asarray(Delta(above)) > 0) and np.all(np.asarray(Delta(below)) < 0)


def test_scalar_and_shape_handling():
    assert isinstance(E(3.0), float)
    assert np.asarray(E(np.ones((2, 3)))).shape == (2, 3)
    assert D(0.0) == pytest.approx(1 / 3)


def test_bad_inputs():
    with pytest.raises(ValueError, match="x"):
        E(-1.0)
    with pytest.raises(ValueError, match="x"):
        E_exact(-1)
    with pytest.raises(TypeError, match="x"):
        E_exact(True)
    with pytest.raises(ValueError, match="x > 0"):
        D_exact(0)
    with pytest.raises(ValueError, match="elem"):
        E(1.0, "e9m9")
