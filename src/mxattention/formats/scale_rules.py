"""Shared-scale rules of MX block quantization (docs/design.md, 'Shared-scale rules').

Exposes `ScaleMode`, `ScaleRule`, `resolve_rule(rule, ladder)`, `boundary_reason(q, ladder)` and
`shared_exponent(amax, rule, ladder)`. A rule turns the block maximum M into the exponent e of the E8M0 scale 2**e:

- `FLOOR` (OCP v1.0): e = floor(log2 M) - emax_elem;
- `CEIL` with boundary q: e = ceil(log2(M / q)), the smallest e with M <= q * 2**e, so the
  normalized block maximum lands in (q/2, q]. TFS is q = the ladder's max (6 for E2M1, NVIDIA's
  "RCEIL"); UOS is q = the ladder's optimal boundary (7.25 for E2M1).

Both are computed exactly: floor(log2 M) comes from `torch.frexp`, and the ceil rule compares M
with q * 2**e in float64, where that product is exact, instead of taking a float log2.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import torch

from mxattention.formats.constants import E8M0_MAX_EXP, E8M0_MIN_EXP
from mxattention.formats.ladders import ElementLadder


class ScaleMode(enum.Enum):
    FLOOR = "floor"
    CEIL = "ceil"


@dataclass(frozen=True)
class ScaleRule:
    """A resolved shared-scale rule; `boundary` is q for CEIL and None for FLOOR."""

    name: str
    mode: ScaleMode
    boundary: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str):
            raise TypeError(f"ScaleRule.name must be a str, got {type(self.name).__name__}")
        if not isinstance(self.mode, ScaleMode):
            raise TypeError(f"ScaleRule.mode must be a ScaleMode, got {self.mode!r}")
        if self.mode is ScaleMode.FLOOR and self.boundary is not None:
            raise ValueError(f"ScaleRule.boundary must be None for the floor rule, got {self.boundary!r}")
        if self.mode is ScaleMode.CEIL:
            q = self.boundary
            if isinstance(q, bool) or not isinstance(q, (int, float)) or not math.isfinite(q) or q <= 0:
                raise ValueError(f"rule boundary q must be a finite float > 0, got {q!r}")


RULE_NAMES = ("ocp", "tfs", "uos")


def resolve_rule(rule: str | float | ScaleRule, ladder: ElementLadder) -> ScaleRule:
    """Turn a rule given as "ocp" / "tfs" / "uos", a float boundary q, or a ScaleRule into a ScaleRule."""
    if isinstance(rule, ScaleRule):
        return rule
    if isinstance(rule, bool):
        raise TypeError("rule must be 'ocp', 'tfs', 'uos', a float boundary q or a ScaleRule, got a bool")
    if isinstance(rule, str):
        key = rule.lower()
        if key == "ocp":
            return ScaleRule("ocp", ScaleMode.FLOOR)
        if key == "tfs":
            return ScaleRule("tfs", ScaleMode.CEIL, float(ladder.max_value))
        if key == "uos":
            return ScaleRule("uos", ScaleMode.CEIL, float(ladder.uos_boundary))
        raise ValueError(f"rule must be one of {RULE_NAMES} or a float boundary q, got {rule!r}")
    if isinstance(rule, (int, float)):
        q = float(rule)
        if not math.isfinite(q) or q <= 0:
            raise ValueError(f"rule (a boundary q) must be a finite float > 0, got {rule!r}")
        return ScaleRule(f"q={q:g}", ScaleMode.CEIL, q)
    raise TypeError(
        f"rule must be 'ocp', 'tfs', 'uos', a float boundary q or a ScaleRule, got {type(rule).__name__}"
    )


def boundary_reason(q: float, ladder: ElementLadder) -> str | None:
    """None if the ceil boundary `q` is meaningful on `ladder` (max L): L/2 < q < 2L; else why not.

    The rule normalizes each block maximum into (q/2, q]. For q <= L/2 the ladder's top binade is
    never used, and 2q is never worse for any element (the ladder doubled, up to L, is a subset of
    itself, so rounding onto the finer grid is at least as close; E2M1 q = 1e-3 rounds every
    element to 0). For q >= 2L every block maximum lands past L and saturates (q = 1e6: every
    element). The primitives (`fake_quantize`, the Qmax sweeps) take any q > 0; configurations
    (`attention.config.QuantSpec`) are checked with this."""
    top = ladder.max_value
    if top / 2 < q < 2 * top:
        return None
    return (
        f"boundary q = {q:g} is outside ({top / 2:g}, {2 * top:g}), the range where the ceil rule is "
        f"meaningful on {ladder.name} (max {top:g}): block maxima are normalized into (q/2, q], so "
        f"q <= {top / 2:g} leaves the top binade unused (2q is never worse) and q >= {2 * top:g} "
        "saturates every block maximum"
    )


def floor_log2(m: torch.Tensor) -> torch.Tensor:
    """floor(log2 m) for finite m > 0 (float32, subnormals included), exactly, as int32."""
    _, exp = torch.frexp(m)  # m = mant * 2**exp with mant in [0.5, 1)
    return exp - 1


def shared_exponent(amax: torch.Tensor, rule: ScaleRule, ladder: ElementLadder) -> torch.Tensor:
    """Unbiased E8M0 exponent (int32, clamped to [-127, 127]) for block maxima `amax` (float32).

    Zero maxima give exponent 0 (scale 1). Non-finite maxima give an arbitrary in-range value:
    the caller marks those blocks NaN.
    """
    finite_pos = torch.isfinite(amax) & (amax > 0)
    m = torch.where(finite_pos, amax, torch.ones_like(amax))
    e_floor = floor_log2(m)
    if rule.mode is ScaleMode.FLOOR:
        e = e_floor - ladder.emax
    else:
        q = float(rule.boundary)  # type: ignore[arg-type]
        # With E = floor(log2 M) and Qe = floor(log2 q) (both exact), M < 2**(E+1) and
        # q >= 2**Qe give e in {E - Qe, E - Qe + 1}; the exact float64 comparison M <= q * 2**e
        # picks between them.
        q_exp = math.frexp(q)[1] - 1
        cand = e_floor - q_exp
        # Clamp before ldexp so q * 2**cand stays a normal float64 and the product is exact.
        cand_c = cand.clamp(-900, 900).double()
        fits = m.double() <= torch.ldexp(torch.full_like(cand_c, q), cand_c)
        e = torch.where(fits, cand, cand + 1)
    e = torch.where(finite_pos, e, torch.zeros_like(e))
    return e.clamp(E8M0_MIN_EXP, E8M0_MAX_EXP).to(torch.int32)
