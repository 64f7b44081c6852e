"""Folding MX values into E4M3 relative to a power-of-two anchor: what FP8 tensor cores consume.

Exposes `fold` (values -> E4M3 values `f` and the anchor exponents `a`, x = f * 2**a),
`unfold`, `fold_anchor`, `fold_p` (the exponential tile under the fixed factor `P_FOLD_EXP`),
`fold_outside` (which elements, MX blocks and anchor groups a fold does not keep exactly) and the
constants `FOLD_TOP` (where the anchor puts a group's largest value) and `FOLD_EXACT_EXPS`.

Why it is exact (docs/fast_mode.md): an E2M1 value c (0.5 .. 6, 2 significant bits) times 2**k is
an E4M3 value for every k in [-8, 6]: 6 * 2**6 = 384 <= 448, and 0.5 * 2**-8 = 2**-9 is E4M3's
smallest subnormal step, so every E2M1 value of an MX block with scale 2**e lands exactly on E4M3
under the anchor a whenever e - a is in [-8, 6]. The anchor of a group of values (a row of Q^, a
head of K^, a column of V^) is a = floor(log2 max|x|) - FOLD_TOP: the group's largest value folds
to 256 or 384 (its MX block's k is 6 for every rule in use), and every block whose scale lies
within 14 binades of the top block's folds exactly. Blocks further down round onto E4M3's grid
(nearest, ties to even; magnitudes below 2**-10 go to 0): `fold_outside` reports them.

Everything is float32 arithmetic on the values themselves (the dequantized MX values, exact in
float32), so the fold needs no codes or scale bytes: x * 2**-a is exact (two power-of-two
multiplies, in [2**-68, 2**68] each, keep every intermediate normal whenever the result is
representable), and the rounding is `formats.rounding.round_to_ladder` on E4M3. NaN stays NaN;
the anchor ignores values that are not finite.
"""

from __future__ import annotations

import torch

from mxattention.formats.ladders import E4M3
from mxattention.formats.mx import pow2
from mxattention.formats.rounding import round_to_ladder

# The anchor puts a group's largest value in [2**FOLD_TOP, 2**(FOLD_TOP + 1)): 256 or 384 for an
# E2M1 value (mantissa 1 or 1.5), under E4M3's 448.
FOLD_TOP = 8
# k = e - a for which every E2M1 value c * 2**k is an E4M3 value (docs/fast_mode.md).
FOLD_EXACT_EXPS = (-8, 6)
# P~ (values <= 1 after the running max) folds with the fixed anchor 2**-P_FOLD_EXP: its top MX
# block (scale 2**-2 under UOS, the largest any rule gives for a maximum of 1) lands at k = 6, and
# blocks with scale >= 2**-16 fold exactly.
P_FOLD_EXP = 8
# The fast mode's P~ blocks take a scale of at least 2**P_MIN_EXP (`mx.fake_quantize(min_exp=)`):
# every block then folds exactly, so the FP8 bytes hold P^ itself and PNQ's l (the sum of P^) is the
# sum of what the P~ V^ product reads, with no rounding between them (docs/fast_mode.md).
P_MIN_EXP = FOLD_EXACT_EXPS[0] - P_FOLD_EXP


def _scale_pow2(x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
    """float32 x * 2**e for int32 e in [-272, 272], by two power-of-two multiplies: exact whenever
    the result is a normal float32 (both halves have the sign of e, so an intermediate underflows
    only where the result does)."""
    e1 = torch.div(e, 2, rounding_mode="floor")
    return x * pow2(e1) * pow2(e - e1)


def fold_anchor(amax: torch.Tensor) -> torch.Tensor:
    """Anchor exponents (int32) of groups with finite maxima `amax` >= 0 (float32):
    floor(log2 amax) - FOLD_TOP, read from the bits (`torch.frexp`: subnormals too); 0 for amax = 0."""
    _mant, exp = torch.frexp(amax.float())
    return torch.where(amax > 0, exp.to(torch.int32) - 1 - FOLD_TOP, 0).to(torch.int32)


def _group_amax(x: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """max |x| over `dims` (kept), ignoring values that are not finite."""
    a = x.abs()
    a = torch.where(torch.isfinite(a), a, 0.0)
    return a.amax(dim=dims, keepdim=True) if a.numel() else a.sum(dim=dims, keepdim=True)


def fold(x: torch.Tensor, dims: tuple[int, ...] | int) -> tuple[torch.Tensor, torch.Tensor]:
    """(f, a): float32 `x` folded into E4M3 with one anchor per group over `dims` (x's values that
    share an anchor: (-1,) a row, (-2,) a column, (-2, -1) a whole matrix).

    f is float32 holding E4M3 values (`f.to(torch.float8_e4m3fn)` is exact), x's shape; a is the
    int32 anchor exponent per group (`fold_anchor`), shaped as x with `dims` of size 1.
    f * 2**a == x wherever `fold_outside` is False.
    """
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    a = fold_anchor(_group_amax(x, dims))
    return round_to_ladder(_scale_pow2(x.float(), -a), E4M3), a


def unfold(f: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """The float32 values f * 2**a of a fold (exact wherever representable in float32)."""
    return _scale_pow2(f.float(), a.expand_as(f))


def fold_p(p_hat: torch.Tensor) -> torch.Tensor:
    """The exponential tile as the FP8 MMA consumes it, in its own units: Q(P~) (float32, values in
    [0, 1]) times 2**P_FOLD_EXP, rounded onto E4M3 (exact for MX blocks scaled >= 2**-16)."""
    return round_to_ladder(p_hat.float() * 2.0**P_FOLD_EXP, E4M3)


def fold_outside(
    x: torch.Tensor, f: torch.Tensor, a: torch.Tensor, block_dim: int, block: int = 32
) -> dict[str, torch.Tensor]:
    """Where the fold (f, a) of `x` is not exact: bool tensors "elements" (x's shape), "blocks"
    (any element of an MX block of `block` along `block_dim`, zero-padded) and "groups" (any
    element of an anchor group, a's shape). NaN counts as exact where x is NaN."""
    back = unfold(f, a)
    bad = (back != x.float()) & ~(torch.isnan(back) & torch.isnan(x))
    moved = bad.movedim(block_dim, -1)
    pad = (-moved.shape[-1]) % block
    if pad:
        moved = torch.nn.functional.pad(moved, (0, pad))
    blocks = moved.unflatten(-1, (-1, block)).any(dim=-1)
    dims = tuple(d for d in range(x.dim()) if a.shape[d] == 1 and x.shape[d] != 1)
    groups = bad.any(dim=dims, keepdim=True) if dims else bad
    return {"elements": bad, "blocks": blocks, "groups": groups}
