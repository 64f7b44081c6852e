"""optimal_boundary: 29/4 exactly for E2M1, the correctly rounded root for every ladder."""

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import pytest

from mxattention.formats.ladders import LADDERS
from mxattention.theory import Delta_exact, QuadraticRoot, optimal_boundary, optimal_boundary_exact


def test_e2m1_is_29_over_4_exactly():
    q = optimal_boundary("e2m1")
    assert q == 7.25 and type(q) is float
    root = optimal_boundary_exact("e2m1")
    assert root.is_rational and root.as_fraction() == Fraction(29, 4)


@pytest.mark.parametrize("name", sorted(LADDERS))
def test_stored_constant_is_the_root(name):
    lad = LADDERS[name]
    q = optimal_boundary(name)
    assert lad.uos_boundary == pytest.approx(q, rel=1e-12)
    assert lad.max_value < q < 2 * lad.max_value


@pytest.mark.parametrize("name", sorted(LADDERS))
def test_root_is_bracketed_by_neighbouring_floats(name):
    q = optimal_boundary(name)
    assert Delta_exact(math.nextafter(q, 0.0), name) < 0 < Delta_exact(math.nextafter(q, math.inf), name)
    assert Delta_exact(q, name) == 0 or optimal_boundary_exact(name).compare(q) != 0


def test_e3m2_root_is_irrational_and_correctly_rounded():
    root = optimal_boundary_exact("e3m2")
    assert not root.is_rational
    assert root == QuadraticRoot(Fraction(30), Fraction(1, 8192), 1)  # 30 + 2**-6.5
    assert str(root) == "30 + sqrt(1/8192)"
    with pytest.raises(ValueError, match="irrational"):
        root.as_fraction()
    q = float(root)
    below, above = Fraction(math.nextafter(q, 0.0)), Fraction(math.nextafter(q, math.inf))
    # correctly rounded: the root lies within half an ulp of q on either side
    assert root.compare((below + Fraction(q)) / 2) > 0 and root.compare((above + Fraction(q)) / 2) < 0


def test_quadratic_root_rounding_and_compare():
    assert float(QuadraticRoot(Fraction(0), Fraction(2))) == math.sqrt(2)
    with localcontext() as ctx:
        ctx.prec = 60
        one_minus_sqrt2 = float(1 - Decimal(2).sqrt())  # float(Decimal) rounds correctly
    assert float(QuadraticRoot(Fraction(1), Fraction(2), -1)) == one_minus_sqrt2
    assert one_minus_sqrt2 != 1 - math.sqrt(2)  # naive float arithmetic is off by an ulp here
    assert float(QuadraticRoot(Fraction(1, 3), Fraction(1, 9))) == float(Fraction(2, 3))
    r = QuadraticRoot(Fraction(5), Fraction(3), -1)  # 5 - sqrt 3 = 3.2679...
    assert r.compare(3) == 1 and r.compare(Fraction(33, 10)) == -1 and r.compare(10) == -1
    assert QuadraticRoot(Fraction(7)).compare(7) == 0
