"""Triton device functions of the MXFP4 cast, shared by the pre-pass and the attention kernel.

Each one is the register-level twin of a PyTorch function in `mxattention.formats`, computed with
the same exact integer / power-of-two arithmetic so the bytes agree bit for bit:

- `shared_exponent`: `formats.scale_rules.shared_exponent` from the fp32 block max's bits
  (floor rule: E - Q_EXP; ceil rule with boundary q = (1 + Q_MANT / 2**23) * 2**Q_EXP:
  E - Q_EXP + [mantissa(M) > mantissa(q)]), clamped to [-127, 127], 0 for a zero block.
- `bf16_pair_floats`: the two bf16 elements of int32 words as fp32 (the pre-pass's row loads).
- `exp2_ftz`: the softmax's exp2, results below 2**-126 flushed to 0 on NVIDIA GPUs (their exp2
  flushes) and the interpreter (a select); ROCm's exp2 is unverified (docs/design.md).
- `exp2_int`: 2**e as fp32 for integer e in [-127, 127] (2**-127 is subnormal); `inv_exp2`: the
  exact inverse of such a power of two (up to 2**126), for divisions by a block scale.
- `block_scale`: 2**e of the same rule, for the attention kernel's P~ blocks (maxima in
  [0, 2**127)); for boundaries >= 2 straight from the bits in four integer ops, where the
  subnormal and clamp cases of `shared_exponent` fall out of the arithmetic.
- `e2m1_round`: round-to-nearest-even onto the E2M1 ladder times 2**e, as a value (the
  decision of `formats.rounding.round_magnitude`); `ladder_code`: the 3-bit code of such a value.
- `elem_round` / `elem_code`: the same for the element ladder ELEM, a constexpr ("e2m1" or
  "e4m3": E4M3's 7-bit magnitude code, saturation at 448 * 2**e; `e4m3_round` on scaled values).
- `cast_blocks`: the whole cast of fp32 blocks along one axis (codes, E8M0 bytes and values), as
  `formats.mx.mx_quantize` / `fake_quantize`, on either ladder; `block_magnitudes`: its steps before
  the outputs (block maxima, exponents, rounded magnitudes), which the fast mode's Q^ fold shares.
- `cast_packed`: the same cast along the last axis straight to packed int32 words (the pre-pass's
  Q^ and packed K^), with the rotation's 1/sqrt(b) folded into the block scale; `signed_nibbles`
  and `pack_nibble_words` are its packing steps.
- `pack_nibbles`, `unpack_nibbles`, `dequant_e2m1`: packing (element 2i in the low nibble) and
  decoding codes x 2**e to fp32 values that bf16 holds exactly (bf16 has fp32's exponent range;
  `decode_e2m1` is its first step, the codes' values times 2**-14);
  `dequant_e4m3`: E4M3 bytes x 2**e to fp32 (exact in bf16 for 2**e >= 2**-124, see its doc).

The host-side encoding of a rule is `rule_constants(rule)` in `mxattention.kernels.rules`.
"""

from __future__ import annotations

from mxattention.kernels._triton import tl, triton

# 2**-104: the packed cast rounds p * 2**-104, which leaves r * 2**-126 (the code's bits; `_cast_words`).
_TWO_M104: tl.constexpr = tl.constexpr(2.0**-104)
_ONE_M22: tl.constexpr = tl.constexpr(1.0 - 2.0**-22)
# 2**-120: E4M3 has exponent bias 7, fp32 127, so r * 2**-120 holds r's E4M3 code in bits 20-26.
_TWO_M120: tl.constexpr = tl.constexpr(2.0**-120)


@triton.jit
def bf16_pair_floats(w):
    """(element 2j, element 2j + 1) as fp32 of int32 words w that each hold two bf16 (little-endian):
    one shift or mask per element, where the compiler's bf16 conversion spends a byte permute and
    two shifts per pair."""
    return (w << 16).to(tl.float32, bitcast=True), (w & -65536).to(tl.float32, bitcast=True)


@triton.jit
def floor_log2_mantissa(m):
    """(floor(log2 m), 23-bit mantissa field of m normalized) for finite fp32 m > 0, subnormals too."""
    bits = m.to(tl.int32, bitcast=True)
    sub = (bits >> 23) == 0
    # A subnormal's integer mantissa converts to fp32 exactly and carries its leading bit as the exponent.
    f = tl.where(sub, (bits & 0x7FFFFF).to(tl.float32), m)
    fb = f.to(tl.int32, bitcast=True)
    e = (fb >> 23) - 127 - tl.where(sub, 149, 0)
    return e, fb & 0x7FFFFF


@triton.jit
def shared_exponent(amax, CEIL: tl.constexpr, Q_EXP: tl.constexpr, Q_MANT: tl.constexpr):
    """E8M0 exponent (int32, [-127, 127]) of fp32 block maxima `amax` >= 0 (finite) under the rule."""
    e, mant = floor_log2_mantissa(amax)
    e = e - Q_EXP
    if CEIL:
        e = e + (mant > Q_MANT).to(tl.int32)
    e = tl.where(amax > 0, e, 0)
    return tl.minimum(tl.maximum(e, -127), 127)


@triton.jit
def block_scale(amax, CEIL: tl.constexpr, Q_EXP: tl.constexpr, Q_MANT: tl.constexpr):
    """2**e (fp32) of `shared_exponent(amax)` for fp32 block maxima 0 < amax < 2**127.

    With Q_EXP >= 1 (every boundary >= 2, all the E2M1 rules in use) four integer ops: adding
    0x7FFFFF - Q_MANT to the bits carries into the exponent field iff the mantissa field exceeds
    Q_MANT (the ceil rule's "+1"); subtracting Q_EXP from the field gives e + 127, and a field <= 0
    means e <= -127, clamped to 2**-127 (subnormal amax always lands there). amax = 0 gives 2**-127
    there (1 on the general path below): the block's values are 0 under any scale.
    """
    if Q_EXP >= 1:
        bits = amax.to(tl.int32, bitcast=True)
        if CEIL:
            bits = bits + (0x7FFFFF - Q_MANT)
        field = (bits & 0x7F800000) - (Q_EXP << 23)
        return tl.maximum(field, 0x400000).to(tl.float32, bitcast=True)
    # A boundary below 2: subnormal maxima need shared_exponent's exact handling.
    return exp2_int(shared_exponent(amax, CEIL, Q_EXP, Q_MANT))


# fp32's smallest normal, 2**-126: exp2 results below it are flushed to 0 (`exp2_ftz`).
FP32_TINY: tl.constexpr = tl.constexpr(1.1754943508222875e-38)


@triton.jit
def exp2_ftz(x, FLUSH: tl.constexpr):
    """2**x in fp32 with results below 2**-126 (fp32's subnormals) flushed to 0, NaN kept: the
    softmax's exp (docs/design.md, 'Special values and overflow'). On NVIDIA GPUs Triton's exp2 is
    `ex2.approx.ftz.f32`, which flushes by itself (H200, Triton 3.6); the non-flushing
    `ex2.approx.f32` costs 3 more instructions per exp. FLUSH (where exp2 keeps subnormals:
    Triton's interpreter) flushes with a select."""
    y = tl.math.exp2(x)
    if FLUSH:
        y = tl.where(y < FP32_TINY, 0.0, y)
    return y


@triton.jit
def exp2_int(e):
    """2**e in fp32, exactly, for int32 e in [-127, 127]."""
    bits = tl.where(e >= -126, (e + 127) << 23, 0x400000)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def inv_exp2(two_e):
    """1 / two_e, exactly, for fp32 powers of two two_e in [2**-127, 2**126] (`block_scale`'s range
    below 2**127), by two integer ops: x * inv_exp2(two_e) is x / two_e without a division (the
    IEEE divide is a dozen instructions on CDNA; `codegen` counts them in the loops)."""
    # 2**k has exponent field k + 127 and its inverse 127 - k = 254 - field; 2**-127's field is 0.
    return ((254 << 23) - (two_e.to(tl.int32, bitcast=True) & 0x7F800000)).to(tl.float32, bitcast=True)


@triton.jit
def ladder_code(r):
    """3-bit E2M1 magnitude code of an exact ladder value r in {0, 0.5, 1, ..., 6}.

    E2M1 is a float with exponent bias 1; r * 2**-126 (exact: 0.5 becomes the subnormal 2**-127)
    gives it fp32's bias, so its exponent field and top mantissa bit are the code, in bits 22-24.
    """
    return (r * 1.1754943508222875e-38).to(tl.int32, bitcast=True) >> 22


@triton.jit
def _ladder_step_round(p, lo, C: tl.constexpr = 4194304.0):
    """p >= 0 rounded (nearest, ties to even) to the ladder step of its binade, unsaturated.

    The float adder does it: with the binade B = 2**max(E_p, log2 lo) (lo = 2**e times 2 to the
    ladder's smallest normal exponent: its subnormals share that binade's step), C B has a unit in
    the last place of B / (2**23 / C), the ladder's step there (C = 2**(23 - mantissa bits): 2**22
    for E2M1, 2**20 for E4M3), so (p + C B) - C B is round-to-nearest-even, for p < 2**105 (C B
    must stay finite). lo may be subnormal (E4M3 at 2**e = 2**-127: 2**-133); C B is not.
    """
    binade = (p.to(tl.int32, bitcast=True) & 0x7F800000).to(tl.float32, bitcast=True)
    step = tl.maximum(binade, lo)
    # Explicit fmas (C B is exact): the same two instructions whether or not the kernel lets the
    # compiler contract a * b + c.
    return tl.fma(step, -C, tl.fma(step, C, p))


@triton.jit
def e2m1_round(p, two_e):
    """Q(p) for p >= 0 against block scale two_e = 2**e, as a value (fp32, exact), with no division.

    `_ladder_step_round`, then saturate at 6 * 2**e. Equals round_magnitude(p / 2**e) * 2**e
    whenever p / 2**e is exact (always, for normal p), for p < 2**105; the attention kernel's P~
    is at most 1. The saturation keeps a NaN p NaN (a plain min would turn it into 6 * 2**e), as
    the reference's cast does.
    """
    r = _ladder_step_round(p, two_e)
    return tl.minimum(r, 6.0 * two_e, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def elem_round(p, two_e, ELEM: tl.constexpr, HW_CAST: tl.constexpr = False):
    """Q(p) for p >= 0 against block scale two_e = 2**e in [2**-127, 2**126] on the element ladder
    ELEM, as a value, exact; NaN stays NaN: round_magnitude(p / 2**e) * 2**e.

    "e2m1": `e2m1_round` on p itself. "e4m3" (3 mantissa bits, smallest normal 2**-6, saturation
    at 448) rounds r = p 2**-e instead and multiplies back (two multiplies, both exact): E4M3's
    normal binades reach 2**-6 * 2**e, which for 2**e <= 2**-121 lies among fp32's subnormals,
    whose bits carry no binade (P~ blocks 112 binades below the row max; E2M1's ladder starts at
    2**e, always normal or the one subnormal binade 2**-127). HW_CAST: `e4m3_round_hw` instead
    (only where `targets.HW_E4M3_CAST` lists the target).
    """
    if ELEM == "e4m3":
        r = p * inv_exp2(two_e)
        if HW_CAST:
            r = e4m3_round_hw(r)
        else:
            r = e4m3_round(r)
        return r * two_e
    else:
        return e2m1_round(p, two_e)


@triton.jit
def e4m3_round(r):
    """r >= 0 rounded to the E4M3 ladder (nearest, ties to even; subnormal step 2**-9), saturated at
    448, NaN kept: `_ladder_step_round` with binades from 2**-6 and C = 2**20, for r < 2**105."""
    q = _ladder_step_round(r, 0.015625, 1048576.0)
    return tl.minimum(q, 448.0, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def e4m3_round_hw(r):
    """`e4m3_round` by the target's float8e4nv conversion and back: on NVIDIA sm_89+ one
    cvt.rn.satfinite.e4m3x2.f32 per pair (round to nearest even, saturating) and one
    cvt.rn.f16x2.e4m3x2; other targets may lower it otherwise (Triton's emulation need not saturate),
    so it is used only where tests/kernels/test_gpu.py showed it equal on every input."""
    return r.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.float32)


@triton.jit
def elem_code(r, ELEM: tl.constexpr):
    """Magnitude code (int32) of an exact ladder value r >= 0 of ELEM: E2M1 `ladder_code` (3 bits),
    E4M3 7 bits: r * 2**-120 has E4M3's bias, so its bits 20-26 are the exponent field and mantissa
    (E4M3's subnormals m * 2**-9 become fp32 subnormals m * 2**-129, bits m << 20)."""
    if ELEM == "e4m3":
        return (r * _TWO_M120).to(tl.int32, bitcast=True) >> 20
    else:
        return ladder_code(r)


@triton.jit
def signed_nibbles(lad, ps, Q_EXP: tl.constexpr):
    """Sign-magnitude E2M1 codes (uint32, bits 0-3) from lad = r * 2**-126 (r a ladder value in
    [0, 6]; its bits are the code in bits 22-24, `ladder_code`) and the signs of ps.

    ps is a block's scaled value 2**-104 x 2**-e, below 2**(Q_EXP + 1 - 104) in magnitude: for
    Q_EXP <= 7 (boundaries below 256; every E2M1 rule in use has 2) its exponent field is below 32,
    so its bits 28-30 are zero and ps >> 28 is the sign times 8, one shift.
    """
    code = lad.to(tl.uint32, bitcast=True) >> 22
    sbits = ps.to(tl.uint32, bitcast=True)
    if Q_EXP <= 7:
        return code + (sbits >> 28)
    return code + ((sbits >> 31) << 3)


@triton.jit
def pack_nibble_words(n, R: tl.constexpr, C: tl.constexpr):
    """[R, C] uint32 nibbles (< 16) -> [R, C // 8] int32, element 8j + i in bits 4i..4i+3 of word j.

    Little-endian, so the words' bytes are those of `pack_nibbles`. Disjoint bits: every merge is a
    shift-add (one instruction).
    """
    lo, hi = tl.split(tl.reshape(n, [R, C // 8, 4, 2]))
    b = lo + (hi << 4)
    b02, b13 = tl.split(tl.reshape(b, [R, C // 8, 2, 2]))
    h = b02 + (b13 << 8)
    h0, h1 = tl.split(h)
    return (h0 + (h1 << 16)).to(tl.int32, bitcast=True)


@triton.jit
def _cast_words(ps, bad, Q_EXP: tl.constexpr, WORDS_LAYOUT: tl.constexpr = None, PACK: tl.constexpr = None):
    """Packed words [R, NB * 4] of ps = x * 2**-e * 2**-104 [R, NB, 32] (signed, fp32).

    WORDS_LAYOUT (Gluon callers, whose layouts must match explicitly): a function (mask, words)
    that gives the per-block mask [R, NB, 1] the layout of the words [R, NB, 4]. PACK: a function
    (lad, ps) -> words [R, NB, 4] that replaces `signed_nibbles` and `pack_nibble_words` (the same
    bits; `prepass_hopper` packs in one asm block per word).

    The cast works on the scaled values 2**-104 p: there the rounding's two fmas (`e2m1_round`,
    steps 2**-104 and up) leave r * 2**-126 directly, whose bits are the code (`ladder_code`), so
    no multiply follows them. Where p >= 2**-22 (every p whose code can be nonzero) the scaled
    value is a normal fp32 and every step is the unscaled one times 2**-104, exactly.
    """
    R: tl.constexpr = ps.shape[0]
    NB: tl.constexpr = ps.shape[1]
    # Saturating first leaves every ladder decision as it was (6 is on the ladder) and keeps |p|
    # small for the rounding; a NaN p belongs to a bad block, whose words are zeroed below.
    a = tl.minimum(tl.abs(ps), 6.0 * _TWO_M104)
    # The rounding constant 2**22 step needs a step in a's binade [2**E, 2**(E + 1)), at most
    # 2**(E + 1) - 2**(E - 21): then a + 2**22 step lies in [2**(E + 22), 2**(E + 23)), whose ulp is
    # the ladder step 2**(E - 1), and 2**22 step is a multiple of it. fl(a (1 - 2**-22)) is such a
    # step (the two lowest a also land on multiples of 2**(E - 23) just below 2**E, which works the
    # same; every fp32 a in [0, 6 * 2**-104] checked): one multiply on the fp32 pipe, where the
    # exponent mask took the integer pipe, which bounds this cast on Hopper. Below 1 (2**-104) the
    # step is 1.
    step = tl.maximum(a * _ONE_M22, _TWO_M104)
    # (a + 2**22 step) 2**-22 - step. Triton emits -x as 0 - x, which the compiler may not turn into
    # the fma's free operand negation (the two differ for x = 0); x * -1.0 becomes one (-1 instruction).
    lad = tl.fma(tl.fma(step, 4194304.0, a), 2.384185791015625e-07, step * -1.0)
    if PACK is not None:
        words = PACK(lad, ps)
    else:
        n = signed_nibbles(lad, ps, Q_EXP)
        words = tl.reshape(pack_nibble_words(tl.reshape(n, [R, NB * 32]), R, NB * 32), [R, NB, 4])
    keep = tl.expand_dims(tl.where(bad, 0, -1), 2)
    if WORDS_LAYOUT is not None:
        keep = WORDS_LAYOUT(keep, words)
    return tl.reshape(words & keep, [R, NB * 4])


@triton.jit
def cast_packed(
    y3,
    NORM: tl.constexpr,
    CEIL: tl.constexpr,
    Q_EXP: tl.constexpr,
    Q_MANT: tl.constexpr,
    IN_THREAD: tl.constexpr,
    FOLD_E_MAX: tl.constexpr,
    BLOCK_LAYOUT: tl.constexpr = None,
    WORDS_LAYOUT: tl.constexpr = None,
    PACK: tl.constexpr = None,
):
    """MXFP4 cast of x = fl(NORM * y3) (fp32 [R, NB, 32], blocks along the last axis) to packed words.

    Returns (int32 words [R, NB * 4] holding the bytes of `pack_nibbles(codes)`, E8M0 bytes [R, NB]
    as int32): the codes and scales of `cast_blocks` on x. NORM (the rotation's 1/sqrt(b)) and
    `_cast_words`' 2**-104 share one multiply with the block scale: max |fl(NORM y)| =
    fl(NORM max |y|) (rounding is monotone), and fl(y * (NORM 2**(-e-104))) = fl(fl(y * NORM) 2**-e)
    2**-104 wherever a cast decision can depend on it, provided the constant is a normal fp32
    (e <= FOLD_E_MAX - 104, FOLD_E_MAX from `prepass.fold_e_max(NORM)`: values below ~2**20) and a
    subnormal fl(y * NORM) scales to at most 0.25 (e >= -124, where both sides round to code 0). A
    tile with any block outside that range takes the multiplies one at a time, exact for every e.

    BLOCK_LAYOUT, WORDS_LAYOUT and PACK serve Gluon callers (`prepass_hopper`), whose layouts must
    match explicitly: (block maxima, y3) -> the maxima in y3's layout reduced over its last axis,
    and `_cast_words`' hooks. The same bits either way.
    """
    amax_bits = _block_amax_bits(y3, 2, IN_THREAD)
    if BLOCK_LAYOUT is not None:
        amax_bits = BLOCK_LAYOUT(amax_bits, y3)
    bad = amax_bits >= 0x7F800000
    amax = tl.where(bad, 0, amax_bits).to(tl.float32, bitcast=True)
    if NORM != 1.0:
        amax = amax * NORM
    e = shared_exponent(amax, CEIL, Q_EXP, Q_MANT)
    c = exp2_int(-e)
    E_LO: tl.constexpr = -124 if NORM != 1.0 else -127
    fold_ok = ((e >= E_LO) & (e <= FOLD_E_MAX - 104)).to(tl.int32)
    # ps keeps the sign of y (and of -0.0), so that nothing but ps is live after the branch (no
    # second copy of the cast, no extra registers).
    if tl.min(tl.min(fold_ok, axis=1), axis=0) == 1:
        ps = y3 * tl.expand_dims(c * (NORM * _TWO_M104), 2)
    else:
        if NORM != 1.0:
            y3 = y3 * NORM
        ps = (y3 * tl.expand_dims(c, 2)) * _TWO_M104
    return _cast_words(ps, bad, Q_EXP, WORDS_LAYOUT, PACK), tl.where(bad, 255, e + 127)


@triton.jit
def pack_nibbles(codes, R: tl.constexpr, C: tl.constexpr):
    """[R, C] int codes < 16 -> [R, C // 2] uint8, element 2i in the low nibble."""
    lo, hi = tl.split(tl.reshape(codes, [R, C // 2, 2]))
    return (lo | (hi << 4)).to(tl.uint8)


@triton.jit
def unpack_nibbles(packed, R: tl.constexpr, C: tl.constexpr):
    """[R, C // 2] uint8 -> [R, C] int32 codes (inverse of `pack_nibbles`)."""
    p = packed.to(tl.int32)
    return tl.reshape(tl.join(p & 15, p >> 4), [R, C])


@triton.jit
def dequant_e2m1(packed, scales, R: tl.constexpr, C: tl.constexpr):
    """Packed E2M1 [R, C // 2] with E8M0 bytes [R, C // 32] along the last axis -> fp32 [R, C].

    Every value has at most 2 significant bits, so the cast of the result to bf16 is exact.

    The 3 magnitude bits placed at fp16's exponent/mantissa boundary read as magnitude * 2**-14
    (0.5 becomes an fp16 subnormal, still exact); the block factor 2**(e + 14) restores it, in two
    powers of two where it exceeds 2**127 (scales above 2**113), each product exact. Scale byte 255
    (a block that held NaN or Inf) decodes to NaN, as `formats.mx.dequantize`.
    """
    return _times_scales(decode_e2m1(packed, R, C), scales, 14, R, C)


@triton.jit
def decode_e2m1(packed, R: tl.constexpr, C: tl.constexpr):
    """Packed E2M1 [R, C // 2] -> fp32 [R, C]: each value times 2**-14, signed (`dequant_e2m1`'s
    first step, before the block scales)."""
    c = unpack_nibbles(packed, R, C)
    h = ((c & 7) << 9) | ((c & 8) << 12)
    return h.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _times_scales(v, scales, BIAS_GAP: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    """v [R, C] (a ladder value times 2**-BIAS_GAP) times its block's E8M0 scale [R, C // 32]: the
    factor 2**(e + BIAS_GAP) in two powers of two where it passes 2**127, each product exact; scale
    byte 255 gives NaN."""
    e = scales.to(tl.int32) - 127
    f = exp2_int(tl.minimum(e + BIAS_GAP, 127))
    g = tl.where(scales == 255, float("nan"), exp2_int(tl.maximum(e + BIAS_GAP - 127, 0)))
    v = tl.reshape(v, [R, C // 32, 32]) * tl.reshape(f, [R, C // 32, 1]) * tl.reshape(g, [R, C // 32, 1])
    return tl.reshape(v, [R, C])


@triton.jit
def dequant_mx(codes, scales, R: tl.constexpr, C: tl.constexpr, ELEM: tl.constexpr):
    """`dequant_e2m1` (packed codes [R, C // 2]) or `dequant_e4m3` (bytes [R, C]) as ELEM says."""
    if ELEM == "e4m3":
        v = dequant_e4m3(codes, scales, R, C)
    else:
        v = dequant_e2m1(codes, scales, R, C)
    return v


@triton.jit
def dequant_e4m3(codes, scales, R: tl.constexpr, C: tl.constexpr):
    """E4M3 bytes [R, C] (sign in bit 7) with E8M0 bytes [R, C // 32] along the last axis -> fp32.

    The 7 magnitude bits at bit 20 read as the value times 2**-120 (`elem_code`), so one shift and
    the block factor decode it. bf16 holds the result exactly where 2**e >= 2**-124 (4 significant
    bits, the lowest >= 2**(e - 9) >= 2**-133, bf16's smallest subnormal); below, the cast to bf16
    rounds (docs/design.md, 'Precision ladder and smoothing'). Scale byte 255 decodes to NaN.
    """
    c = codes.to(tl.int32)
    v = (((c & 127) << 20) | ((c & 128) << 24)).to(tl.float32, bitcast=True)
    return _times_scales(v, scales, 120, R, C)


@triton.jit
def _block_amax_bits(x3, AXIS: tl.constexpr, IN_THREAD: tl.constexpr):
    """Bits of max |x| over AXIS (a block of 32) of fp32 x3; NaN and Inf show as bits >= 0x7F800000.

    IN_THREAD (AXIS is the last axis and each block lies in one thread): a tree of NaN-keeping
    float maxima, |x| folded into the first level's instructions (31 per block, no shuffles);
    otherwise the integer max of the |x| bit patterns, which order like the magnitudes with NaN and
    Inf above every finite value (Triton's reduction, across lanes where it must).
    """
    if IN_THREAD:
        m = tl.abs(x3)
        for i in tl.static_range(5):
            lo, hi = tl.split(tl.reshape(m, [x3.shape[0], x3.shape[1], 16 >> i, 2]))
            m = tl.maximum(lo, hi, propagate_nan=tl.PropagateNan.ALL)
        amax_bits = tl.reshape(m, [x3.shape[0], x3.shape[1]]).to(tl.int32, bitcast=True)
    else:
        amax_bits = tl.max(x3.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=AXIS)
    return amax_bits


@triton.jit
def block_magnitudes(
    x3, CEIL: tl.constexpr, Q_EXP: tl.constexpr, Q_MANT: tl.constexpr, AXIS: tl.constexpr,
    IN_THREAD: tl.constexpr, ELEM: tl.constexpr,
):  # fmt: skip
    """The steps of the MX cast of fp32 x3 (blocks along AXIS) before its outputs: (bad: the blocks
    holding NaN or Inf; amax: each block's max |x| as fp32, 0 for a bad one; e: its shared exponent
    under the rule; r: each |x| 2**-e rounded onto the ELEM ladder, exact, like x3). `cast_blocks`
    and the fast mode's Q^ fold (`fold8.fold_rows`) both start here, so they round alike."""
    amax_bits = _block_amax_bits(x3, AXIS, IN_THREAD)
    bad = amax_bits >= 0x7F800000
    amax = tl.where(bad, 0, amax_bits).to(tl.float32, bitcast=True)
    e = shared_exponent(amax, CEIL, Q_EXP, Q_MANT)
    a = tl.abs(x3) * tl.expand_dims(exp2_int(-e), AXIS)
    if ELEM == "e4m3":
        r = e4m3_round(a)
    else:
        r = e2m1_round(a, 1.0)
    return bad, amax, e, r


@triton.jit
def cast_blocks(
    x3,
    CEIL: tl.constexpr,
    Q_EXP: tl.constexpr,
    Q_MANT: tl.constexpr,
    AXIS: tl.constexpr,
    IN_THREAD: tl.constexpr,
    ELEM: tl.constexpr,
):
    """MX cast of fp32 x3 in blocks along AXIS onto the element ladder ELEM ("e2m1", "e4m3").

    Returns (codes like x3: 4-bit E2M1 / 8-bit E4M3, sign-magnitude; E8M0 bytes reduced over AXIS;
    the dequantized values like x3).
    A block with a NaN or Inf gets scale byte 255, codes 0 and NaN values, as `mx_quantize` /
    `fake_quantize`. Codes and values come from one rounding (`elem_round` on the scaled
    magnitude, below 2 q), so the two outputs cannot disagree. IN_THREAD picks how the block max is
    reduced (`_block_amax_bits`; the same result either way). No defaults: Triton 3.6 (the H200's)
    passes a string constexpr default to an inner jit function as a raw str and fails to compile.
    """
    bad, _amax, e, r = block_magnitudes(x3, CEIL, Q_EXP, Q_MANT, AXIS, IN_THREAD, ELEM)
    sign = x3.to(tl.int32, bitcast=True) & -2147483648  # -0.0 keeps its sign, as in mx_quantize
    if ELEM == "e4m3":
        sign_bit = (sign >> 24) & 128
    else:
        sign_bit = (sign >> 28) & 8
    codes = tl.where(tl.expand_dims(bad, AXIS), 0, elem_code(r, ELEM) | sign_bit)
    # A NaN block factor makes every value of a bad block NaN, with no select per element.
    factor = tl.expand_dims(tl.where(bad, float("nan"), exp2_int(e)), AXIS)
    vals = ((r * factor).to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    scales = tl.where(bad, 255, e + 127)
    return codes, scales, vals
