"""Round-to-nearest-even onto an element ladder, and the ladder's bit codes.

Exposes `round_magnitude`, `round_to_ladder`, `ladder_codes`, `decode_codes`.

Rounding uses the float32 adder itself: for |v| in binade 2**E (E clamped below at the ladder's
smallest normal exponent, which also covers its subnormals), C = 2**(E + 23 - mbits) has a unit in
the last place equal to the ladder's step in that binade, so `(|v| + C) - C` rounds |v| to that
step with IEEE round-to-nearest-even: ties land on the even step count, i.e. the even mantissa.
The result is then saturated at the ladder's max. Everything is elementwise and vectorizes.
"""

from __future__ import annotations

import torch

from mxattention.formats.constants import F32_EXP_BIAS, F32_MANTISSA_BITS
from mxattention.formats.ladders import ElementLadder

_DEVICE_CACHE: dict[tuple[ElementLadder, torch.device], torch.Tensor] = {}


def code_magnitudes(ladder: ElementLadder, device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 tensor of the ladder's magnitudes, indexed by magnitude code."""
    key = (ladder, torch.device(device))
    t = _DEVICE_CACHE.get(key)
    if t is None:
        t = torch.tensor(ladder.magnitudes, dtype=torch.float32, device=device)
        _DEVICE_CACHE[key] = t
    return t


def round_magnitude_(a: torch.Tensor, ladder: ElementLadder) -> torch.Tensor:
    """Round non-negative float32 `a` to the ladder IN PLACE (nearest, ties to even, saturated).

    In place because the casts run this over every element: a fresh tensor per step would cost
    an allocation and a page-in of the whole tensor each time.
    """
    lo = F32_EXP_BIAS + ladder.min_normal_exp
    # Above 2**(emax+1) every value saturates, so capping the binade keeps C finite for any input.
    hi = F32_EXP_BIAS + ladder.emax + 1
    c = a.view(torch.int32) >> F32_MANTISSA_BITS
    c.clamp_(lo, hi).add_(F32_MANTISSA_BITS - ladder.mbits).bitwise_left_shift_(F32_MANTISSA_BITS)
    c = c.view(torch.float32)
    return a.add_(c).sub_(c).clamp_(max=ladder.max_value)


def round_magnitude(a: torch.Tensor, ladder: ElementLadder) -> torch.Tensor:
    """Non-negative float32 `a` rounded to the ladder (nearest, ties to even), saturated."""
    return round_magnitude_(a.clone(), ladder)


def round_to_ladder(v: torch.Tensor, ladder: ElementLadder) -> torch.Tensor:
    """float32 `v` rounded to the signed, saturating ladder; keeps the sign of zero."""
    return round_magnitude_(v.abs(), ladder).copysign_(v)


def magnitude_codes(r: torch.Tensor, ladder: ElementLadder) -> torch.Tensor:
    """Bit codes (uint8, sign excluded) of float32 magnitudes `r` that lie exactly on the ladder."""
    # Normal values: float32's exponent and top mantissa bits are contiguous, so one shift gives
    # (biased exponent << mbits | mantissa); rebiasing is one subtraction.
    normal = (r.view(torch.int32) >> (F32_MANTISSA_BITS - ladder.mbits)) - (
        (F32_EXP_BIAS - ladder.bias) << ladder.mbits
    )
    # Subnormals (and zero): a whole number of the smallest step.
    sub = (r * 2.0 ** (ladder.mbits - ladder.min_normal_exp)).to(torch.int32)
    return torch.where(r < 2.0**ladder.min_normal_exp, sub, normal).to(torch.uint8)


def ladder_codes(v: torch.Tensor, ladder: ElementLadder) -> torch.Tensor:
    """Element codes (uint8: sign bit above the magnitude bits) of float32 values `v`."""
    mag = magnitude_codes(round_magnitude_(v.abs(), ladder), ladder)
    return mag | (torch.signbit(v).to(torch.uint8) << (ladder.bits - 1))


def decode_codes(codes: torch.Tensor, ladder: ElementLadder) -> torch.Tensor:
    """float32 values of element codes (uint8)."""
    mags = code_magnitudes(ladder, codes.device)
    val = mags[(codes & ((1 << (ladder.bits - 1)) - 1)).long()]
    return torch.where(((codes >> (ladder.bits - 1)) & 1).bool(), -val, val)
