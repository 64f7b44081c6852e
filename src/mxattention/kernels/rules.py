"""Host-side encoding of a shared-scale rule as the kernels' compile-time constants.

Exposes `RuleConstants`, `rule_constants(rule, elem)` and `KERNEL_ELEMS` (the element ladders the
kernels compute). A rule on a ladder becomes (CEIL, Q_EXP, Q_MANT):

- floor (OCP): e = floor(log2 M) - emax, so CEIL = False, Q_EXP = emax (2 for E2M1, 8 for E4M3);
- ceil with boundary q = mq * 2**Q_EXP, mq in [1, 2): with M = mM * 2**E, M <= q * 2**(E - Q_EXP)
  iff mM <= mq, so e = E - Q_EXP + [mM > mq]. mM has 23 fraction bits, so mM > mq iff its fraction
  field exceeds Q_MANT = floor(frac(mq) * 2**23), exactly, even for q not representable in fp32.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from mxattention.formats.constants import F32_MANTISSA_BITS
from mxattention.formats.ladders import get_ladder
from mxattention.formats.scale_rules import ScaleMode, ScaleRule, resolve_rule

# The ladders with a kernel cast (`cast.elem_round`): E2M1 (MXFP4) and E4M3 (MXFP8).
KERNEL_ELEMS = ("e2m1", "e4m3")


@dataclass(frozen=True)
class RuleConstants:
    ceil: bool
    q_exp: int
    q_mant: int


@functools.lru_cache(maxsize=64, typed=True)  # every launch asks; a rule's constants never change
def rule_constants(rule: str | float | ScaleRule, elem: str = "e2m1") -> RuleConstants:
    """The kernel constants of a shared-scale rule ("ocp", "tfs", "uos", a float q, ...) on the
    element ladder `elem` ("uos" and "tfs" are that ladder's boundaries: E4M3 UOS 464 + 2**-15
    gives Q_EXP = 8, Q_MANT = 0.8125 * 2**23 + 1)."""
    ladder = get_ladder(elem)
    r = resolve_rule(rule, ladder)
    if r.mode is ScaleMode.FLOOR:
        return RuleConstants(False, ladder.emax, 0)
    mant, exp = math.frexp(float(r.boundary))  # q = mant * 2**exp, mant in [0.5, 1)
    frac = mant * 2.0 - 1.0  # exact: q = (1 + frac) * 2**(exp - 1)
    return RuleConstants(True, exp - 1, math.floor(math.ldexp(frac, F32_MANTISSA_BITS)))
