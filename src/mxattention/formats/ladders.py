"""Element formats ("ladders") of the MX family, described as data.

Exposes `ElementLadder`, the five OCP element formats `E2M1`, `E2M3`, `E3M2`, `E4M3`,
`E5M2`, and `get_ladder(name)`. A ladder is a sign-magnitude minifloat with `ebits`
exponent bits, `mbits` mantissa bits and exponent `bias`; its largest finite magnitude is
`max_value` (the OCP element formats have no Inf, and E4M3 reserves only S.1111.111 for NaN).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class ElementLadder:
    """A saturating minifloat element format.

    `uos_boundary` is the Universal-Optimal-Scaling boundary q* of this ladder: the root of
    E(q) = 8 E(q/2) (docs/design.md, 'Universal Optimal Scaling'), computed exactly by `mxattention.theory` and stored here
    so that the casts need not import the theory (the theory tests check the two agree).
    """

    name: str
    ebits: int
    mbits: int
    bias: int
    max_value: float
    uos_boundary: float

    @property
    def bits(self) -> int:
        """Bits per element, sign included."""
        return 1 + self.ebits + self.mbits

    @property
    def emax(self) -> int:
        """Exponent of the largest power of two <= max_value (OCP's emax_elem)."""
        return math.floor(math.log2(self.max_value))

    @property
    def min_normal_exp(self) -> int:
        """Unbiased exponent of the smallest normal number (also the subnormal binade's)."""
        return 1 - self.bias

    @property
    def max_code(self) -> int:
        """Magnitude code (sign bit excluded) of `max_value`."""
        return self.encode_magnitude(self.max_value)

    def encode_magnitude(self, value: float) -> int:
        """Bit pattern (without sign) of a magnitude that lies exactly on the ladder."""
        if value == 0:
            return 0
        _m, e = math.frexp(value)  # value = m * 2**e, m in [0.5, 1)
        exp = e - 1
        if exp < self.min_normal_exp:
            return round(value / 2.0 ** (self.min_normal_exp - self.mbits))
        field = exp + self.bias
        mant = round((value / 2.0**exp - 1.0) * 2**self.mbits)
        return (field << self.mbits) | mant

    @cached_property
    def magnitudes(self) -> tuple[float, ...]:
        """All finite non-negative values, ascending (the ladder G+)."""
        vals = {0.0}
        for field in range(2**self.ebits):
            for mant in range(2**self.mbits):
                if field == 0:
                    v = mant / 2**self.mbits * 2.0**self.min_normal_exp
                else:
                    v = (1 + mant / 2**self.mbits) * 2.0 ** (field - self.bias)
                if v <= self.max_value:
                    vals.add(v)
        return tuple(sorted(vals))


E2M1 = ElementLadder("e2m1", ebits=2, mbits=1, bias=1, max_value=6.0, uos_boundary=7.25)
E2M3 = ElementLadder("e2m3", ebits=2, mbits=3, bias=1, max_value=7.5, uos_boundary=7.875)
E3M2 = ElementLadder("e3m2", ebits=3, mbits=2, bias=3, max_value=28.0, uos_boundary=30.011048543456038)
E4M3 = ElementLadder("e4m3", ebits=4, mbits=3, bias=7, max_value=448.0, uos_boundary=464.0000305175781)
E5M2 = ElementLadder("e5m2", ebits=5, mbits=2, bias=15, max_value=57344.0, uos_boundary=61440.00000000093)

LADDERS: dict[str, ElementLadder] = {lad.name: lad for lad in (E2M1, E2M3, E3M2, E4M3, E5M2)}


def get_ladder(elem: str | ElementLadder) -> ElementLadder:
    """Look up a ladder by name ("e2m1", "e2m3", "e3m2", "e4m3", "e5m2") or pass one through."""
    if isinstance(elem, ElementLadder):
        return elem
    if not isinstance(elem, str):
        raise TypeError(f"elem must be a ladder name (str) or ElementLadder, got {type(elem).__name__}")
    try:
        return LADDERS[elem.lower()]
    except KeyError:
        raise ValueError(f"elem must be one of {sorted(LADDERS)}, got {elem!r}") from None
