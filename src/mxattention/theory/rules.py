"""The shared-scale rules compared in docs/design.md, 'Shared-scale rules' (OCP, TFS, UOS, any boundary q), in theory.

Exposes `Interval`, `RuleRow`, `RULE_NAMES`, `normalized_max_range`, `overflow_threshold`,
`overflow_interval`, `overflow_probability`, `ocp_overflow_probability` and `rule_table`.

A rule is "ocp" (floor rule: M/sigma in [2^emax, 2^(emax+1))), "tfs" (ceil rule with q = max),
"uos" (ceil rule with q = optimal_boundary) or a float q (ceil rule: M/sigma in (q/2, q]).
Probabilities are under the log-uniform density of M (H = 1), so the probability of a sub-interval
[a, b] of the one-octave range is log2(b/a).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from mxattention.formats.ladders import get_ladder
from mxattention.theory.boundary import optimal_boundary
from mxattention.theory.error import Ladder
from mxattention.theory.objective import J

RULE_NAMES = ("ocp", "tfs", "uos")


@dataclass(frozen=True)
class Interval:
    """An interval of normalized magnitudes (units of the block scale sigma)."""

    low: float
    high: float
    low_closed: bool
    high_closed: bool

    def __contains__(self, x: object) -> bool:
        if not isinstance(x, numbers.Real) or isinstance(x, bool):
            return False
        above = x >= self.low if self.low_closed else x > self.low
        below = x <= self.high if self.high_closed else x < self.high
        return above and below

    @property
    def log2_length(self) -> float:
        """log2(high / low): the probability of the interval under the log-uniform density, if <= 1."""
        return math.log2(self.high) - math.log2(self.low)

    def __str__(self) -> str:
        left, right = "[" if self.low_closed else "(", "]" if self.high_closed else ")"
        return f"{left}{_short(self.low)}, {_short(self.high)}{right}"


def _short(x: float) -> str:
    """Six significant digits when they say x exactly, else the full repr (464.0000305175781 != 464)."""
    s = f"{x:g}"
    return s if float(s) == x else repr(x)


@dataclass(frozen=True)
class RuleRow:
    """One row of the rule table of docs/design.md, 'Shared-scale rules', for one ladder."""

    rule: str
    exponent: str  # the exponent formula, as text
    boundary: float  # q of the ceil rule; for OCP the end 2^(emax+1) of its [2^emax, 2^(emax+1)) range
    normalized_max_range: Interval
    overflow_interval: Interval | None
    overflow_probability: float  # log-uniform M
    j_loguniform: float  # J over the rule's range, log-uniform M


def _boundary(rule: str | float, elem: Ladder) -> tuple[str, float]:
    """Canonical rule name and the boundary of its range (the one place rules are parsed)."""
    ladder = get_ladder(elem)
    if isinstance(rule, str):
        key = rule.lower()
        if key == "ocp":
            return key, 2.0 ** (ladder.emax + 1)
        if key == "tfs":
            return key, float(ladder.max_value)
        if key == "uos":
            return key, optimal_boundary(ladder)
        raise ValueError(f"rule must be one of {RULE_NAMES} or a float boundary q, got {rule!r}")
    if isinstance(rule, bool) or not isinstance(rule, (int, float)):
        raise TypeError(f"rule must be one of {RULE_NAMES} or a float boundary q, got {type(rule).__name__}")
    q = float(rule)
    if not (math.isfinite(q) and q > 0):
        raise ValueError(f"rule (a boundary q) must be finite and > 0, got {rule!r}")
    return f"q={q:g}", q


def normalized_max_range(rule: str | float, elem: Ladder = "e2m1") -> Interval:
    """Where the normalized block max M/sigma lands: [4, 8) for OCP on E2M1, (q/2, q] for a ceil rule."""
    name, q = _boundary(rule, elem)
    if name == "ocp":
        return Interval(q / 2, q, low_closed=True, high_closed=False)
    return Interval(q / 2, q, low_closed=False, high_closed=True)


def overflow_threshold(elem: Ladder = "e2m1") -> tuple[float, bool]:
    """(T, T_included): magnitudes above T round past max (on the unbounded ladder) and saturate.

    T = max + step/2, step = max minus the next-lower ladder value (7 for E2M1). At T itself
    ties-to-even decides: it overflows when max has an odd mantissa (E2M1: 7 -> 8), not for E4M3
    (448 has mantissa 110, so 464 rounds to 448).
    """
    ladder = get_ladder(elem)
    top, below = ladder.magnitudes[-1], ladder.magnitudes[-2]
    return top + (top - below) / 2, bool(ladder.max_code & 1)


def overflow_interval(rule: str | float, elem: Ladder = "e2m1") -> Interval | None:
    """The part of the rule's normalized-max range that saturates ([7, 8) for OCP on E2M1), or None."""
    rng = normalized_max_range(rule, elem)
    t, t_in = overflow_threshold(elem)
    if t > rng.high or (t == rng.high and not (t_in and rng.high_closed)):
        return None
    if t < rng.low:
        return rng
    low_closed = t_in and (t > rng.low or rng.low_closed)
    return Interval(t, rng.high, low_closed=low_closed, high_closed=rng.high_closed)


def overflow_probability(rule: str | float, elem: Ladder = "e2m1") -> float:
    """P(the normalized block max saturates) for log-uniform M: log2 of the overflow interval's ends."""
    inter = overflow_interval(rule, elem)
    return 0.0 if inter is None else inter.log2_length


def ocp_overflow_probability(elem: Ladder = "e2m1") -> float:
    """P(OCP-normalized max rounds above max and saturates), log-uniform M; log2(8/7) for E2M1."""
    return overflow_probability("ocp", elem)


_EXPONENT_TEXT = {
    "ocp": "floor(log2 M) - {emax}",
    "tfs": "ceil(log2(M/{q:g}))",
    "uos": "ceil(log2(M/{q}))",
}


def rule_table(elem: Ladder = "e2m1") -> list[RuleRow]:
    """Rows for OCP, TFS and UOS on one ladder (docs/design.md, 'Shared-scale rules' / the paper's Table 1)."""
    ladder = get_ladder(elem)
    rows = []
    for name in RULE_NAMES:
        _, q = _boundary(name, ladder)
        rows.append(
            RuleRow(
                rule=name,
                exponent=_EXPONENT_TEXT[name].format(emax=ladder.emax, q=q),
                boundary=q,
                normalized_max_range=normalized_max_range(name, ladder),
                overflow_interval=overflow_interval(name, ladder),
                overflow_probability=overflow_probability(name, ladder),
                j_loguniform=float(J(q, ladder)),
            )
        )
    return rows
