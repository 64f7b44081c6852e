"""Device functions of the fast mode's fold (docs/fast_mode.md, `formats.fold`), shared by the pre-pass
(`prepass`: Q^ folded in registers, K^ / V^ anchors) and the fold kernels of `attention_fwd_fp8`.

Exposes `FOLD_TOP`, `NO_ANCHOR`, `finite_abs`, `anchor_of`, `anchor_or_zero`, `fold_values`,
`e4m3_bytes`, `fold_rows`, `fold_decoded`, `key_slot`, `in_key_slots`, `pow2_bits` and
`score_factor`. Imports only `cast`, so `prepass` can use them without importing the attention
kernels.
"""

from __future__ import annotations

from mxattention.kernels._triton import tl, triton
from mxattention.kernels.cast import (
    _times_scales,
    block_magnitudes,
    e2m1_round,
    e4m3_round,
    elem_code,
    exp2_int,
    floor_log2_mantissa,
)

FOLD_TOP = 8  # formats.fold.FOLD_TOP: a group's largest value folds to 256 or 384
NO_ANCHOR = -(2**20)  # the anchor of a group of zeros: below every real anchor (atomic max identity)


@triton.jit
def finite_abs(x):
    """|x| with NaN / Inf as 0: the anchors ignore values that are not finite."""
    a = tl.abs(x)
    return tl.where(a < float("inf"), a, 0.0)


@triton.jit
def anchor_of(amax):
    """floor(log2 amax) - FOLD_TOP (int32) for fp32 amax >= 0, NO_ANCHOR for amax = 0."""
    e, _m = floor_log2_mantissa(tl.where(amax > 0, amax, 1.0))
    return tl.where(amax > 0, e - 8, -1048576)


@triton.jit
def anchor_or_zero(a):
    """The anchor a group folds with: NO_ANCHOR (a group of zeros) folds with 0 (`formats.fold`)."""
    return tl.where(a == -1048576, 0, a)


@triton.jit
def fold_values(x, a):
    """E4M3 values of x 2**-a (fp32, signed; NaN kept): two exact power-of-two multiplies (each
    half of -a within [-68, 68]), then round to nearest even on E4M3 by the float adder."""
    na = -a
    h = tl.where(na >= 0, na // 2, -((-na + 1) // 2))
    f = x * exp2_int(h) * exp2_int(na - h)
    r = e4m3_round(tl.abs(f))
    return tl.where(f < 0, -r, r)


@triton.jit
def e4m3_bytes(r, BY_BITS: tl.constexpr):
    """float8e4nv of fp32 E4M3 values r (exact, |r| <= 448, or NaN). BY_BITS: the byte built from
    the bits (`cast.elem_code`, the sign, 0x7F for NaN), the same on every target (Triton 3.9's
    interpreter converts NaN to 256); else the target's conversion, exact on such values."""
    if BY_BITS:
        code = elem_code(tl.abs(r), "e4m3") + tl.where(r < 0, 128, 0)
        code = tl.where(r != r, 0x7F, code)
        return code.to(tl.uint8).to(tl.float8e4nv, bitcast=True)
    else:
        return r.to(tl.float8e4nv)


@triton.jit
def fold_rows(x3, CEIL: tl.constexpr, Q_EXP: tl.constexpr, Q_MANT: tl.constexpr, IN_THREAD: tl.constexpr,
              BY_BITS: tl.constexpr):  # fmt: skip
    """(float8e4nv bytes [R, NB * 32], anchors a [R] int32) of fp32 x3 [R, NB, 32]: its MX (E2M1) cast
    in blocks along the last axis, each row folded with its anchor. Bit for bit what
    `e4m3_bytes(fold_values(vals, a), True)` gives for `cast.cast_blocks`' vals, with a =
    `anchor_or_zero(anchor_of(max finite |vals| of the row))`; BY_BITS False (the GPU) converts by the
    target's instruction, exact on these values (E4M3 values, +0 for -0, canonical NaN).

    The row's largest |value| comes from the block maxima (the rounding is monotone: a block's top is
    its amax rounded), not from a pass over the values. Where every block holding a nonzero value lies
    at most 8 binades under its row's anchor (k = e - a >= -8, so r 2**k is an E4M3 value: 0.5 2**k
    >= 2**-9, E4M3's subnormal step), the fold is one multiply by 2**k per value; a tile with any
    block further down (values that round onto E4M3's subnormals) takes `fold_values` instead.
    """
    R: tl.constexpr = x3.shape[0]
    NB: tl.constexpr = x3.shape[1]
    bad, amax, e, r = block_magnitudes(x3, CEIL, Q_EXP, Q_MANT, 2, IN_THREAD, "e2m1")  # (bad blocks: NaN r)
    top = e2m1_round(amax * exp2_int(-e), 1.0) * exp2_int(e)  # 0 for a NaN / Inf block (finite_abs)
    a = anchor_or_zero(anchor_of(tl.max(top, 1)))
    k = e - a[:, None]
    # r with x's sign (one tensor live across the branch: r and the signs apart spilled registers).
    signed = (r.to(tl.int32, bitcast=True) | (x3.to(tl.int32, bitcast=True) & -2147483648)).to(
        tl.float32, bitcast=True
    )
    if tl.max(((top > 0) & (k < -8)).to(tl.int32)) == 0:
        # r 2**k signed; fma(., ., +0) turns -0 into +0 as fold_values does (NaN blocks: NaN). k tops
        # out at 9 (a row whose block exponents clamp at -127: top 0.5 x 2**-127); zero blocks hold 0
        # under any factor, so k is only clamped into exp2_int's range.
        f2k = tl.where(bad, float("nan"), exp2_int(tl.minimum(tl.maximum(k, -8), 64)))
        out = e4m3_bytes(tl.reshape(tl.fma(signed, f2k[:, :, None], 0.0), [R, NB * 32]), BY_BITS)
    else:
        # cast_blocks' vals ((r 2**e) | sign equals (r | sign) 2**e; NaN blocks NaN), folded.
        vals = signed * tl.where(bad, float("nan"), exp2_int(e))[:, :, None]
        out = e4m3_bytes(tl.reshape(fold_values(vals, a[:, None, None]), [R, NB * 32]), True)
    return out, a


@triton.jit
def fold_decoded(v, scales, a, R: tl.constexpr, C: tl.constexpr):
    """float8e4nv bytes [R, C] of packed E2M1 values decoded to v = value 2**-14 (fp32 [R, C], signed:
    `cast.dequant_e2m1`'s first step) with E8M0 bytes `scales` [R, C / 32] along the last axis, each
    row folded with its anchor a [R] (int32, `anchor_or_zero`'s): bit for bit
    `e4m3_bytes(fold_values(dequant_e2m1(...), a), True)`, the bytes built from the bits (Triton
    3.6's conversion wrote zeros in these tiles at head dim 32 on the H200: `targets.HW_E4M3_CAST`).
    Where every block lies at most 8 binades under its anchor (or holds NaN) one multiply by
    2**(e - a + 14) gives each folded value exactly; else the tile decodes and rounds as
    `fold_values` (a block of zeros far under its anchor sends its tile there too: its scale byte
    does not say it is zero)."""
    nan = scales == 255
    k = scales.to(tl.int32) - 127 - a[:, None]
    if tl.max(((k < -8) & ~nan).to(tl.int32)) == 0:
        # (k of a block of zeros may be large: its values stay 0, so k is only clamped to a finite factor)
        factor = tl.where(nan, float("nan"), exp2_int(tl.minimum(k, 113) + 14))
        f = tl.fma(tl.reshape(v, [R, C // 32, 32]), tl.reshape(factor, [R, C // 32, 1]), 0.0)
        return e4m3_bytes(tl.reshape(f, [R, C]), True)
    else:
        return e4m3_bytes(fold_values(_times_scales(v, scales, 14, R, C), a[:, None]), True)


@triton.jit
def key_slot(n):
    """Where key n sits in the transposed V^ (int32, within its 32-key block): bits (i1 i0 t1 t0 e)
    of n % 32 become (i1 t1 t0 i0 e). It is the column order in which Hopper's FP8 wgmma A operand
    (k_width 4) holds a row of P~ when each thread keeps the values the accumulator of S gave it, so
    the Gluon kernel hands P~ to the P~ V^ wgmma without moving values between lanes
    (`attention_fwd_hopper_fp8._key_slots`); the `tl` kernel's V^ keeps the keys' order (a gather
    through key_slot made its loads 8x slower on the H200)."""
    return (n & -32) | (n & 17) | (((n >> 3) & 1) << 1) | (((n >> 1) & 3) << 2)


@triton.jit
def in_key_slots(f):
    """f [R, C] (keys last, C a multiple of 32) with each block of 32 keys in `key_slot` order: the
    value of key n at column key_slot(n). key_slot swaps the bit fields (i0) and (t1 t0) of n % 32, so
    it is a reshape, one permute and a reshape: the caller then stores whole rows of contiguous
    bytes (a store through key_slot's addresses wrote one byte per instruction: the V^ folds ran 4x
    slower than the K^ ones on the H200, benchmarks/results/fp8_operands_parts_h200.json)."""
    R: tl.constexpr = f.shape[0]
    C: tl.constexpr = f.shape[1]
    f = tl.reshape(f, [R, C // 32, 2, 2, 4, 2])  # (row, block, i1, i0, t1 t0, e)
    return tl.reshape(tl.permute(f, [0, 1, 2, 4, 3, 5]), [R, C])


@triton.jit
def pow2_bits(e):
    """2**e as fp32 for any int32 e, built from the bits: what float64 2**e rounds to in fp32 (the
    host's `attention_fwd_fp8.pow2_f32`): subnormal for e in [-149, -127], 0 below (2**-150 ties to
    even, down), Inf above 127. No multiply, so a target that flushes subnormal products cannot
    change it."""
    normal = (tl.minimum(e, 128) + 127) << 23
    sub = 1 << tl.minimum(tl.maximum(e, -149) + 149, 22)  # (shifts kept in [0, 22] where unused)
    bits = tl.where(e >= -126, normal, tl.where(e >= -149, sub, 0))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def score_factor(c_mant, e):
    """max(c 2**e, 2**-126) (fp32, NaN kept) for c = c_mant 2**c_exp given as c_mant (fp32 in [1, 2),
    or NaN / Inf / -1 for c NaN / Inf / <= 0: `attention_fwd_fp8.score_scale_parts`) and e the anchor
    sum plus c_exp: `fp8_operands`' rowscale (float64 c 2**e rounded once, clamped), bit for bit.
    In the normal range the product is exact; below 2**-126 either value clamps to 2**-126."""
    f = c_mant * pow2_bits(e)
    return tl.maximum(f, 1.1754943508222875e-38, propagate_nan=tl.PropagateNan.ALL)
