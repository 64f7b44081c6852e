"""Phase densities: normalized over a period, non-negative, 1-periodic; g transforms them to x."""

import math

import numpy as np
import pytest

from mxattention.theory import Harmonic, LogUniform, Mixture, PhaseDensity, WrappedNormal, figure_densities, g

_T = (np.arange(20_000) + 0.5) / 20_000  # midpoint rule: spectrally accurate for smooth periodic H


@pytest.mark.parametrize("density", list(figure_densities().values()), ids=list(figure_densities()))
def test_normalized_nonnegative_periodic(density):
    assert isinstance(density, PhaseDensity)
    h = density.H(_T)
    assert np.mean(h) == pytest.approx(1.0, abs=1e-12)
    assert np.all(h >= 0)
    np.testing.assert_allclose(density.H(_T + 3.0), h, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(density.H(_T - 2.0), h, rtol=1e-9, atol=1e-12)


def test_figure_densities_include_non_uniform_ones():
    dens = figure_densities()
    assert isinstance(dens["log-uniform"], LogUniform)
    non_uniform = [d for name, d in dens.items() if name != "log-uniform"]
    assert len(non_uniform) >= 2
    for d in non_uniform:
        assert np.ptp(d.H(_T)) > 0.5


def test_wrapped_normal_matches_direct_sum_and_wide_limit():
    d = WrappedNormal(0.3, 0.2)
    t = np.array([0.0, 0.3, 0.8])
    direct = sum(np.exp(-0.5 * ((t + k - 0.3) / 0.2) ** 2) for k in range(-30, 31)) / (
        0.2 * math.sqrt(2 * math.pi)
    )
    np.testing.assert_allclose(d.H(t), direct, rtol=1e-13)
    np.testing.assert_allclose(WrappedNormal(0.0, 3.0).H(_T), 1.0, atol=1e-12)


def test_g_integrates_to_one_over_any_octave():
    for d in figure_densities().values():
        for q in (6.0, 7.25, 100.0):
            x = q / 2 * 2.0**_T
            # dx = x ln2 dt, so integral_{q/2}^{q} g dx = integral_0^1 H dt
            assert np.mean(g(x, d) * x * math.log(2.0)) == pytest.approx(1.0, abs=1e-12)


def test_g_doubles_at_half():
    d = figure_densities()["two-bump"]
    x = np.linspace(5, 9, 17)
    np.testing.assert_allclose(g(x / 2, d), 2 * g(x, d), rtol=1e-12)


def test_invalid_parameters():
    with pytest.raises(ValueError, match="sigma"):
        WrappedNormal(0.0, 0.0)
    with pytest.raises(ValueError, match="amplitudes"):
        Harmonic((0.7, 0.5), (0.0, 0.0))
    with pytest.raises(ValueError, match="weights"):
        Mixture((LogUniform(),), (-1.0,))
    with pytest.raises(ValueError, match="x > 0"):
        g(0.0, LogUniform())
