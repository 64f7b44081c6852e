"""Normalized-max ranges, overflow probabilities (exact and Monte Carlo) and the rule table."""

import math

import numpy as np
import pytest

from mxattention.formats.ladders import LADDERS, get_ladder
from mxattention.theory import (
    Interval,
    normalized_max_range,
    ocp_overflow_probability,
    overflow_interval,
    overflow_probability,
    rule_table,
)


def test_e2m1_ocp_overflow_is_log2_8_over_7():
    p = ocp_overflow_probability("e2m1")
    assert p == pytest.approx(math.log2(8 / 7), abs=1e-12)
    assert round(p, 5) == 0.19265


def _ocp_saturation_rate(name: str, n: int, rng: np.random.Generator) -> float:
    lad = get_ladder(name)
    mags = np.array(lad.magnitudes)
    # The unbounded ladder continues one step past max; landing there means overflow, then saturation.
    ext = np.append(mags, mags[-1] + (mags[-1] - mags[-2]))
    m = 2.0 ** rng.uniform(-20.0, 20.0, n)  # log-uniform block maxima over 40 octaves
    _, e2 = np.frexp(m)  # floor(log2 m) = e2 - 1, exactly
    x = m / 2.0 ** (e2 - 1 - lad.emax)
    nearest = np.argmin(np.abs(x[:, None] - ext[None, :]), axis=1)
    return float(np.mean(nearest == ext.size - 1))


@pytest.mark.parametrize("name", sorted(LADDERS))
def test_ocp_overflow_matches_monte_carlo(name):
    n = 200_000
    p = ocp_overflow_probability(name)
    rate = _ocp_saturation_rate(name, n, np.random.default_rng(1))
    assert abs(rate - p) < 5 * math.sqrt(p * (1 - p) / n)


def test_ranges_e2m1():
    assert normalized_max_range("ocp") == Interval(4.0, 8.0, True, False)
    assert normalized_max_range("tfs") == Interval(3.0, 6.0, False, True)
    assert normalized_max_range("UOS") == Interval(3.625, 7.25, False, True)
    assert normalized_max_range(6.5) == Interval(3.25, 6.5, False, True)
    assert (
        str(normalized_max_range("ocp")) == "[4, 8)" and str(normalized_max_range("uos")) == "(3.625, 7.25]"
    )
    assert 4.0 in normalized_max_range("ocp") and 8.0 not in normalized_max_range("ocp")
    assert 3.0 not in normalized_max_range("tfs") and 6.0 in normalized_max_range("tfs")
    assert np.float32(5.0) in normalized_max_range("tfs") and "5" not in normalized_max_range("tfs")


def test_overflow_intervals():
    assert overflow_interval("ocp") == Interval(7.0, 8.0, True, False)  # ties-to-even: 7 -> 8 -> saturates
    assert overflow_interval("tfs") is None
    assert overflow_interval("uos") == Interval(7.0, 7.25, True, True)
    assert overflow_interval("ocp", "e4m3") == Interval(464.0, 512.0, False, False)  # 464 ties to 448
    assert overflow_probability("uos") == pytest.approx(math.log2(7.25 / 7), abs=1e-15)
    assert overflow_probability(7.0) == 0.0 and overflow_probability(16.0) == 1.0


def test_rule_table_e2m1():
    rows = {r.rule: r for r in rule_table("e2m1")}
    assert list(rows) == ["ocp", "tfs", "uos"]
    assert rows["uos"].boundary == 7.25 and rows["tfs"].boundary == 6.0
    assert rows["ocp"].exponent == "floor(log2 M) - 2" and rows["uos"].exponent == "ceil(log2(M/7.25))"
    assert rows["ocp"].overflow_probability == pytest.approx(0.19265, abs=1e-5)
    assert rows["uos"].j_loguniform < min(rows["tfs"].j_loguniform, rows["ocp"].j_loguniform)


@pytest.mark.parametrize("name", sorted(LADDERS))
def test_uos_never_worse_than_tfs_or_ocp(name):
    rows = {r.rule: r for r in rule_table(name)}
    assert rows["uos"].j_loguniform <= rows["tfs"].j_loguniform * (1 + 1e-12)
    assert rows["uos"].j_loguniform < rows["ocp"].j_loguniform


def test_bad_rules():
    with pytest.raises(ValueError, match="rule"):
        normalized_max_range("floor")
    with pytest.raises(ValueError, match="rule"):
        normalized_max_range(-1.0)
    with pytest.raises(TypeError, match="rule"):
        normalized_max_range(True)
