"""The fast mode's forward (`AttentionConfig.mma == "fp8"`): MX attention on FP8 tensor cores.

Exposes `fp8_reason` (why a call of a fast config does not run here), `fold_pass` (the bf16 Q^ /
K^ / V^ of the exact pre-pass folded into one-byte E4M3 with their anchors), `fp8_operands`
(the three of a chunk from the bf16 pre-pass, with the per-row score scale and the per-column output
scale: the reference path), `fp8_operands_from_inputs` (the same bytes straight from Q, K, V: the Q^
fold inside the pre-pass, K^ / V^ from packed MX bytes by `fold_packed`; the planned path) and
`mx_attention_fwd_fp8` (the attention kernel). `fused.run_plan` runs a plan whose `mma` is "fp8"
through them (`fused._run_chunk_fp8`); `codegen.build_fp8` builds the kernel offline.
docs/fast_mode.md says what is computed and why; `attention.fast` is its emulation, which the
tests compare this kernel with. The fold's device functions live in `kernels.fold8` (the pre-pass
uses them too).

- Fold (`formats.fold`): each value x of Q^ (per row), K^ (per KV head) and V^ (per column)
  becomes f = E4M3(x 2**-a), a = floor(log2 max|x| of its group) - 8, computed from the exact bf16
  values of the pre-pass with the float adder's rounding (`cast.e4m3_round`, so the bytes do not
  depend on a conversion's rounding mode: the conversion sees E4M3 values only). V^ is written
  transposed [Dv, Lk] (Hopper's FP8 wgmma reads its B operand K-major from shared memory); for the
  Gluon kernel the keys of each block of 32 permuted (`key_slot`: the order in which its P~ leaves
  the accumulator of S).
- Scores: S = (F_q F_k^T) * rowscale, rowscale = scale log2(e) 2**(a_q + a_k) per query row (fp32,
  exact: a power of two times the exact path's constant), so the scores are the exact path's
  wherever the dot sums are; then the exact path's softmax and P~ cast, line for line
  (`attention_fwd._attend_tile`'s order and roundings).
- P~: the E2M1 values P^ times 2**8 rounded onto E4M3 (exact for blocks scaled >= 2**-16), one
  byte each; PNQ's l adds exactly those values in fp32 (`l = l alpha + tile` by one fma). Each key tile's P^ V^ goes to a fresh fp32
  accumulator and is added to O~ by one fma: `O~ = O~ alpha + acc` (Hopper's FP8 wgmma accumulates
  with fewer bits than fp32, so a tile's 4 k-steps are all that share it).
- The factor 2**8 comes from exp2: the kernels subtract m - 8 instead of the running max m
  (`fp8_shift`; exact while |m| < 2**27, beyond which rows keep the factor 1).
- Finally O = O~ / l * 2**a_v per column, lse = (m - 8) + log2(l) in natural-log units.
"""

from __future__ import annotations

import torch

from mxattention.kernels._triton import kernels_interpreted, tl, triton
from mxattention.kernels.attention_fwd import LOG2E, MASK_ADD, MASK_BOOL, MASK_NONE, _mask_scores
from mxattention.kernels.cast import _ladder_step_round as ladder_step_round
from mxattention.kernels.cast import (
    block_scale,
    decode_e2m1,
    e2m1_round,
    exp2_ftz,
)
from mxattention.kernels.fold8 import (
    NO_ANCHOR,
    anchor_of,
    anchor_or_zero,
    e4m3_bytes,
    finite_abs,
    fold_decoded,
    fold_values,
    in_key_slots,
    pow2_bits,
)
from mxattention.kernels.online_softmax import finish_lse

FP32_TINY_HOST = 2.0**-126  # fp32's smallest normal: the least score factor (`fp8_operands`)
FOLD_ROWS = 32  # rows per program of the fold passes
# P~'s rounding onto E4M3 by the hardware conversion (`targets.hw_e4m3_cast`) is off: on the H200
# (Triton 3.6, 2026-12-03, benchmarks/check_fp8_gpu.py's row-sum case, V = identity on outlier-heavy
# fp32 Q, K) it gave NaN rows where the software rounding and the emulation are finite; the software
# rounding costs ~15 % of the kernel's time there (benchmarks/NOTES.md). Off until the case is understood.
HW_P_CAST = False


def fp8_reason(varlen: bool, smooth_q: bool, debug_p: bool = False) -> str | None:
    """None if the FP8 forward serves a fast-mode call, else why such a call runs the reference
    (the emulation, the same numerics): varlen calls and Q smoothing are not implemented here."""
    if varlen:
        return "the FP8 fast mode's kernel serves dense calls; varlen calls of it run the reference"
    if smooth_q:
        return "the FP8 fast mode's kernel does not smooth Q"
    return None


def key_slots(n: torch.Tensor) -> torch.Tensor:
    """`key_slot` on the host (int64 tensors): V8t[..., key_slots(k)] is key k's column."""
    return (n & -32) | (n & 17) | (((n >> 3) & 1) << 1) | (((n >> 1) & 3) << 2)


@triton.jit
def _fold_anchor_kernel(X, A, L, DP: tl.constexpr, BL: tl.constexpr, PER_ROW: tl.constexpr):
    """Anchors of X [BH, L, DP] (bf16, exact MX values): PER_ROW, one per row into A [BH, L]; else
    one per column of this program's BL rows into A [BH, L / BL, DP] (reduced by the host)."""
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rows = pid * BL + tl.arange(0, BL)
    cols = tl.arange(0, DP)
    x = tl.load(X + (bh * L + rows[:, None]) * DP + cols[None, :]).to(tl.float32)
    if PER_ROW:
        tl.store(A + bh * L + rows, anchor_of(tl.max(finite_abs(x), 1)))
    else:
        tl.store(A + (bh * (L // BL) + pid) * DP + cols, anchor_of(tl.max(finite_abs(x), 0)))


@triton.jit
def _fold_kernel(
    X,
    F,
    A,
    L,
    DP: tl.constexpr,
    BL: tl.constexpr,
    ANCHORS: tl.constexpr,
    TRANS: tl.constexpr,
    SLOTS: tl.constexpr,
):
    """F = E4M3(X 2**-a) for X [BH, L, DP] (bf16, exact MX values). ANCHORS: 0 one per row, computed
    here and stored into A [BH, L]; 1 one per head, read from A [BH]; 2 one per column, read from
    A [BH, DP]. TRANS: F is [BH, DP, L] (V^; SLOTS: the keys of each block of 32 in `key_slot`
    order, for the Gluon kernel), else [BH, L, DP]. Groups of zeros fold with anchor 0."""
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    rows = pid * BL + tl.arange(0, BL)
    cols = tl.arange(0, DP)
    x = tl.load(X + (bh * L + rows[:, None]) * DP + cols[None, :]).to(tl.float32)
    if ANCHORS == 0:
        a = anchor_or_zero(anchor_of(tl.max(finite_abs(x), 1)))
        tl.store(A + bh * L + rows, a)
        a = a[:, None]
    elif ANCHORS == 1:
        a = tl.load(A + bh)
    else:
        a = tl.load(A + bh * DP + cols)[None, :]
    f = e4m3_bytes(fold_values(x, a), True)
    if TRANS:  # V^ [DP, keys]; SLOTS: the keys of each block of 32 in `key_slot` order
        f = tl.trans(f)
        if SLOTS:
            f = in_key_slots(f)
        tl.store(F + (bh * DP + cols[:, None]) * L + rows[None, :], f)
    else:
        tl.store(F + (bh * L + rows[:, None]) * DP + cols[None, :], f)


def _no_anchor_to_zero(a: torch.Tensor) -> torch.Tensor:
    return torch.where(a == NO_ANCHOR, 0, a)


def fold_pass(x: torch.Tensor, anchors: str, slots: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """(F, a) for a bf16 pre-pass output x [B, H, Lp, Dp] (Lp a multiple of 32): `anchors` "row" (Q^:
    F [B, H, Lp, Dp], a int32 [B, H, Lp]), "head" (K^: F likewise, a [B, H]) or "column" (V^:
    F transposed [B, H, Dp, Lp], with `slots` the keys of each block of 32 in `key_slot` order (the
    Gluon kernel's), else in key order (the `tl` kernel's: it loads V^ tiles contiguously), a
    [B, H, Dp]). F is float8_e4m3fn, `formats.fold.fold`'s values."""
    b, h, lp, dp = x.shape
    assert lp % FOLD_ROWS == 0 and x.is_contiguous() and anchors in ("row", "head", "column")
    grid = (lp // FOLD_ROWS, b * h)
    dev = x.device
    if anchors == "row":
        f = torch.empty((b, h, lp, dp), dtype=torch.float8_e4m3fn, device=dev)
        a = torch.empty((b, h, lp), dtype=torch.int32, device=dev)
        _fold_kernel[grid](x, f, a, lp, DP=dp, BL=FOLD_ROWS, ANCHORS=0, TRANS=False, SLOTS=False)
        return f, a
    if anchors == "head":
        rows = torch.empty((b, h, lp), dtype=torch.int32, device=dev)
        _fold_anchor_kernel[grid](x, rows, lp, DP=dp, BL=FOLD_ROWS, PER_ROW=True)
        a = _no_anchor_to_zero(rows.amax(dim=-1)).contiguous()
        f = torch.empty((b, h, lp, dp), dtype=torch.float8_e4m3fn, device=dev)
        _fold_kernel[grid](x, f, a, lp, DP=dp, BL=FOLD_ROWS, ANCHORS=1, TRANS=False, SLOTS=False)
        return f, a
    part = torch.empty((b, h, lp // FOLD_ROWS, dp), dtype=torch.int32, device=dev)
    _fold_anchor_kernel[grid](x, part, lp, DP=dp, BL=FOLD_ROWS, PER_ROW=False)
    a = _no_anchor_to_zero(part.amax(dim=-2)).contiguous()
    f = torch.empty((b, h, dp, lp), dtype=torch.float8_e4m3fn, device=dev)
    _fold_kernel[grid](x, f, a, lp, DP=dp, BL=FOLD_ROWS, ANCHORS=2, TRANS=True, SLOTS=slots)
    return f, a


@triton.jit
def _fold_packed_kernel(
    Codes,
    Scales,
    F,
    A,
    ColScale,
    L,
    DP: tl.constexpr,
    BL: tl.constexpr,
    COLUMNS: tl.constexpr,
    SLOTS: tl.constexpr,
):
    """F = E4M3(x 2**-a) of the MX values x of packed E2M1 codes + E8M0 bytes (`prepass` output),
    decoded exactly (`cast.dequant_e2m1`: the values `prepass(out_bf16=True)` writes, as fp32).
    COLUMNS false (K^): Codes [BH, L, DP / 2], Scales [BH, L, DP / 32], one anchor per head from
    A [BH], F [BH, L, DP]. COLUMNS (V^, keys last): Codes [BH, DP, L / 2], Scales [BH, DP, L / 32],
    one anchor per column from A [BH, DP], F [BH, DP, L] (SLOTS: keys in `key_slot` order within
    each block of 32); the first program of each head writes ColScale [BH, DP] = 2**a (fp32, the
    host's `pow2_f32`). A holds the pre-pass's atomic maxima (NO_ANCHOR: a group of zeros, folded
    with 0). Each program: BL rows of K^ or BL keys of V^."""
    pid = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    if COLUMNS:
        d = tl.arange(0, DP)[:, None]
        crow = (bh * DP + d) * (L // 2) + pid * (BL // 2)
        srow = (bh * DP + d) * (L // 32) + pid * (BL // 32)
        codes = tl.load(Codes + crow + tl.arange(0, BL // 2)[None, :])
        scales = tl.load(Scales + srow + tl.arange(0, BL // 32)[None, :])
        a = anchor_or_zero(tl.load(A + bh * DP + tl.arange(0, DP)))
        f = fold_decoded(decode_e2m1(codes, DP, BL), scales, a, DP, BL)  # [DP, BL]
        if SLOTS:
            f = in_key_slots(f)
        tl.store(F + (bh * DP + d) * L + pid * BL + tl.arange(0, BL)[None, :], f)
        if pid == 0:
            tl.store(ColScale + bh * DP + tl.arange(0, DP), pow2_bits(a))
    else:
        rows = (bh * L + pid * BL + tl.arange(0, BL))[:, None]
        codes = tl.load(Codes + rows * (DP // 2) + tl.arange(0, DP // 2)[None, :])
        scales = tl.load(Scales + rows * (DP // 32) + tl.arange(0, DP // 32)[None, :])
        a = anchor_or_zero(tl.load(A + bh)) + tl.zeros([BL], tl.int32)
        f = fold_decoded(decode_e2m1(codes, BL, DP), scales, a, BL, DP)
        tl.store(F + rows * DP + tl.arange(0, DP)[None, :], f)


def fold_packed(
    codes: torch.Tensor,
    scales: torch.Tensor,
    anchors: torch.Tensor,
    *,
    columns: bool,
    slots: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(F, colscale) from the anchored pre-pass's packed K^ (`prepass.prepass_k_anchored`: codes
    [B, H, Lp, Dp / 2], anchors [B * H]; F [B, H, Lp, Dp], colscale None) or V^
    (`prepass.prepass_v(anchors=...)`, columns: codes [B, H, Dp, Lp / 2], anchors [B * H * Dp]; F
    [B, H, Dp, Lp] with `slots` as `fold_pass`, colscale fp32 [B, H, Dp] = 2**a_v): the bytes
    `fold_pass` makes from the bf16 pre-pass, bit for bit, from 0.53 bytes per element instead of 2
    (and no anchor pass: the pre-pass's atomic maxima). The bytes are built from the bits: Triton
    3.6's fp32 -> E4M3 conversion wrote 0 for some values of these tiles at head dim 32 on the H200
    (2026-12-04), where the Q^ pass's row layout converts right (`prepass.PassPlan.hw_cast`)."""
    b, h = codes.shape[:2]
    dp = 32 * scales.shape[3] if not columns else codes.shape[2]
    lp = codes.shape[2] if not columns else 2 * codes.shape[3]
    assert (
        lp % FOLD_ROWS == 0 and codes.is_contiguous() and scales.is_contiguous() and anchors.is_contiguous()
    )
    dev = codes.device
    shape = (b, h, dp, lp) if columns else (b, h, lp, dp)
    f = torch.empty(shape, dtype=torch.float8_e4m3fn, device=dev)
    colscale = torch.empty((b, h, dp), dtype=torch.float32, device=dev) if columns else None
    # V^: 64 keys per program where they divide, so that each row's codes are a whole 32-byte sector.
    bl = 2 * FOLD_ROWS if columns and lp % (2 * FOLD_ROWS) == 0 else FOLD_ROWS
    _fold_packed_kernel[(lp // bl, b * h)](
        codes, scales, f, anchors, f if colscale is None else colscale, lp, DP=dp, BL=bl, COLUMNS=columns,
        SLOTS=slots,
    )  # fmt: skip
    return f, colscale


def pow2_f32(e: torch.Tensor, c: float = 1.0) -> torch.Tensor:
    """fp32 c * 2**e for int tensors e (computed in float64, then rounded once: exact wherever the
    result is a normal fp32)."""
    return torch.ldexp(torch.tensor(c, dtype=torch.float64, device=e.device), e.double()).float()


@triton.jit
def fp8_shift(m):
    """m - 8 (fp32, exact) for |m| < 2**27, else m: the running max as `fp8_p_tile` subtracts it, so
    that exp2 gives P~ times the fixed factor 2**8 (formats.fold.P_FOLD_EXP) without a multiply.
    Rows with |m| >= 2**27 (where m - 8 is not a float: from 2**27 to 2**28 it would round to m - 16
    or m) keep the factor 1: their P~ folds exactly down to block scales 2**-8 instead of 2**-16,
    and l, O and lse stay consistent (`fp8_finish_lse`)."""
    return tl.where(tl.abs(m) < 134217728.0, m - 8.0, m)


@triton.jit
def fp8_p_tile(
    s, m, c, CEIL: tl.constexpr, Q_EXP: tl.constexpr, Q_MANT: tl.constexpr, EXP_FLUSH: tl.constexpr
):
    """(m_new, alpha, p3 = P~ 2**8, r3 = P^ 2**8) of one key tile's folded scores s [R, BN] (masked
    keys -inf) and the running max m [R], with the per-row factor c [R] (`online_softmax.p_tile`'s
    operations, c per row, the max shifted by `fp8_shift`: the factor 2**8 of the fold comes from
    exp2); p3 and r3 [R, BN / 32, 32] fp32, r3 the E2M1 values times 2**8 (E2M1 values of the
    scaled block), not yet rounded onto E4M3. Layout-free: the `tl` FP8 kernel and the Gluon one
    (`attention_fwd_hopper_fp8`) both call it."""
    R: tl.constexpr = s.shape[0]
    BN: tl.constexpr = s.shape[1]
    # As the exact kernel: block maxima from the scores, the two roundings (s * c, then - m), here
    # minus m - 8 (exact): the row max's element is exp2(8) = 256, the others 2**8 times theirs up to
    # the rounding of the difference at 8 (an ulp of 2**-21 in the exponent); alpha is unchanged.
    s3 = tl.reshape(s, [R, BN // 32, 32])
    s_blk = tl.max(s3, 2)
    m_new = tl.maximum(m, tl.max(s_blk, 1) * c)
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    m_sh = fp8_shift(m_use)
    alpha = exp2_ftz(fp8_shift(m) - m_sh, EXP_FLUSH)
    p3 = exp2_ftz(s3 * c[:, None, None] - m_sh[:, None, None], EXP_FLUSH)
    p_blk = exp2_ftz(s_blk * c[:, None] - m_sh[:, None], EXP_FLUSH)
    # Block scales of at least 2**-8 here, 2**-16 of the row's largest (formats.fold.P_MIN_EXP, the
    # reference's `fake_quantize(min_exp=)`): every E2M1 value of P^ 2**8 is then an E4M3 value, so
    # the bytes hold r3 exactly and PNQ's l, the sum of r3, is the sum of what P~ V^ reads (one max
    # per block; rows with |m| >= 2**27, whose factor is 1 (`fp8_shift`), get the floor 2**-8 of
    # their own units: exact there too, coarser than the reference's).
    two_e = tl.maximum(block_scale(p_blk, CEIL, Q_EXP, Q_MANT), 0.00390625)
    # P^ (E2M1 values of the scaled block), E4M3 values. A ceil rule with boundary q < 7 never rounds
    # an element above 6 * 2**e (it is at most q 2**e, and 6 is the nearest ladder value below 7),
    # so `e2m1_round`'s saturation is the identity there (NaN stays NaN either way): one min per
    # element less (a boundary of 6.5; UOS's 7.25 keeps the min).
    if CEIL and (Q_EXP <= 1 or (Q_EXP == 2 and Q_MANT < 6291456)):
        r3 = ladder_step_round(p3, two_e[:, :, None])
    else:
        r3 = e2m1_round(p3, two_e[:, :, None])
    return m_new, alpha, p3, r3


@triton.jit
def fp8_finish_lse(l, m):
    """lse (natural log) of rows with running max m and folded sum l (P~ times 2**(m - fp8_shift(m)),
    `fp8_p_tile`); -inf for an empty row."""
    return finish_lse(l, fp8_shift(tl.where(m == float("-inf"), 0.0, m)))


@triton.jit
def fp8_finish_o(o_tilde, l, colscale, OUT_MAX: tl.constexpr):
    """O = O~ / l * 2**a_v (colscale [DV], per output column) of rows with folded sum l [R] and O~
    [R, DV]; an empty row (l = 0) gets 0; OUT_MAX > 0: saturated to +-OUT_MAX, NaN kept
    (`online_softmax.finish_o` with the column anchors)."""
    empty = l == 0.0
    out = o_tilde / tl.where(empty, 1.0, l)[:, None] * colscale[None, :]
    out = tl.where(empty[:, None], 0.0, out)
    if OUT_MAX > 0:  # saturate, as attention.reference.cast_output
        out = tl.minimum(
            tl.maximum(out, -OUT_MAX, propagate_nan=tl.PropagateNan.ALL),
            OUT_MAX,
            propagate_nan=tl.PropagateNan.ALL,
        )
    return out


@triton.jit
def _fp8_tile(
    m,
    l,
    o_tilde,
    q8,
    c,
    K8,
    V8,
    k_base,
    v_rows,
    start_n,
    offs_m,
    Lq,
    Lk,
    mask_base,
    stride_mm,
    stride_mn,
    Pdbg,
    dbg_row,
    BN: tl.constexpr,
    DQ: tl.constexpr,
    MASKED: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASK_MODE: tl.constexpr,
    PNQ: tl.constexpr,
    CEIL: tl.constexpr,
    Q_EXP: tl.constexpr,
    Q_MANT: tl.constexpr,
    EXP_FLUSH: tl.constexpr,
    DEBUG_P: tl.constexpr,
    QK_ACC: tl.constexpr,
    PV_ACC: tl.constexpr,
    P_CVT: tl.constexpr,
):
    """One key tile (`attention_fwd._attend_tile` on folded E4M3 operands): (m, l, o_tilde) after keys
    [start_n, start_n + BN); l and o_tilde in folded units (x 2**8, V^ per column x 2**-a_v)."""
    BM: tl.constexpr = q8.shape[0]
    offs_n = start_n + tl.arange(0, BN)
    k8 = tl.load(K8 + (k_base + offs_n[:, None]) * DQ + tl.arange(0, DQ)[None, :])
    s = tl.dot(q8, tl.trans(k8), max_num_imprecise_acc=QK_ACC)
    if MASKED and MASK_MODE == 2:
        s = s * c[:, None]  # additive masks are added in log2 units, to scaled scores
        s = _mask_scores(s, offs_m, offs_n, Lq, Lk, mask_base, stride_mm, stride_mn, CAUSAL, MASK_MODE)
        c = tl.full([BM], 1.0, tl.float32)
    elif MASKED:
        s = _mask_scores(s, offs_m, offs_n, Lq, Lk, mask_base, stride_mm, stride_mn, CAUSAL, MASK_MODE)
    m_new, alpha, p3, r3 = fp8_p_tile(s, m, c, CEIL, Q_EXP, Q_MANT, EXP_FLUSH)
    # r3 holds E4M3 values (`fp8_p_tile`'s block-scale floor), so either conversion to bytes is exact
    # and l adds r3 itself: exactly the values the MMA reads.
    f3 = r3
    f = tl.reshape(f3, [BM, BN])
    if P_CVT:  # the hardware's rounding conversion, one instruction per pair
        p8 = tl.reshape(r3.to(tl.float8e4nv, fp_downcast_rounding="rtne"), [BM, BN])
    else:
        # (EXP_FLUSH is set on the interpreter, whose float8 conversion of NaN is wrong: bytes by bits there)
        p8 = e4m3_bytes(f, EXP_FLUSH)
    if DEBUG_P:
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        unfold = tl.where(fp8_shift(m_use) != m_use, 0.00390625, 1.0)  # the factor of `fp8_shift`
        tl.store(Pdbg + dbg_row + offs_n[None, :], f * unfold[:, None], mask=offs_m[:, None] < Lq)
    v8 = tl.load(V8 + v_rows + offs_n[None, :])  # [DV, BN]: keys contiguous (K-major B operand)
    acc = tl.dot(p8, tl.trans(v8), max_num_imprecise_acc=PV_ACC)
    if PNQ:
        # l adds exactly the values P~ V^ multiplies, in fp32: the FP8 accumulator's sums would move
        # the induced weights' row sums off 1 by up to 3.6e-3 (H200, benchmarks/check_fp8_gpu.py).
        l = tl.fma(l, alpha, tl.sum(tl.sum(f3, 2), 1))  # the Gluon kernel's order
    else:
        l = alpha * l + tl.sum(tl.reshape(p3, [BM, BN]), 1)
    o_tilde = tl.fma(o_tilde, alpha[:, None], acc)  # one rounding (the Gluon FP8 kernel's too)
    return m_new, l, o_tilde


@triton.jit
def _fp8_attention_kernel(
    Q8,
    RowScale,
    K8,
    V8,
    ColScale,
    Mask,
    Out,
    Lse,
    Pdbg,
    Lq,
    Lk,
    Dv,
    H,
    GROUP,
    LQP,
    LKP,
    stride_mb,
    stride_mh,
    stride_mm,
    stride_mn,
    stride_ob,
    stride_oh,
    stride_om,
    stride_od,
    BM: tl.constexpr,
    BN: tl.constexpr,
    DQ: tl.constexpr,
    DV: tl.constexpr,
    CAUSAL: tl.constexpr,
    MASK_MODE: tl.constexpr,
    PNQ: tl.constexpr,
    CEIL: tl.constexpr,
    Q_EXP: tl.constexpr,
    Q_MANT: tl.constexpr,
    OUT_MAX: tl.constexpr,
    EXP_FLUSH: tl.constexpr,
    DEBUG_P: tl.constexpr,
    QK_ACC: tl.constexpr,
    PV_ACC: tl.constexpr,
    P_CVT: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    bhk = b * (H // GROUP) + h // GROUP  # GQA: the KV head, no copy
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_dv = tl.arange(0, DV)
    q_rows = bh.to(tl.int64) * LQP + offs_m
    q8 = tl.load(Q8 + q_rows[:, None] * DQ + tl.arange(0, DQ)[None, :])
    c = tl.load(RowScale + q_rows)  # scale log2(e) 2**(a_q + a_k), per row
    k_base = bhk.to(tl.int64) * LKP
    v_rows = (bhk.to(tl.int64) * DV + offs_dv[:, None]) * LKP
    dbg_row = (bh.to(tl.int64) * Lq + offs_m[:, None]) * LKP
    m = tl.full([BM], float("-inf"), tl.float32)
    l = tl.zeros([BM], tl.float32)
    o_tilde = tl.zeros([BM, DV], tl.float32)
    mask_base = Mask + b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
    hi = Lk
    full = 0
    if MASK_MODE == 0:
        full = Lk // BN * BN
    if CAUSAL:
        hi = tl.minimum(Lk, (pid_m + 1) * BM)
        full = tl.minimum(full, (pid_m * BM + 1) // BN * BN)
    for start_n in tl.range(0, full, BN):
        m, l, o_tilde = _fp8_tile(
            m, l, o_tilde, q8, c, K8, V8, k_base, v_rows, start_n, offs_m, Lq, Lk, mask_base, stride_mm,
            stride_mn, Pdbg, dbg_row, BN, DQ, False, CAUSAL, MASK_MODE, PNQ, CEIL, Q_EXP, Q_MANT, EXP_FLUSH,
            DEBUG_P, QK_ACC, PV_ACC, P_CVT,
        )  # fmt: skip
    for start_n in tl.range(full, hi, BN, num_stages=1):
        m, l, o_tilde = _fp8_tile(
            m, l, o_tilde, q8, c, K8, V8, k_base, v_rows, start_n, offs_m, Lq, Lk, mask_base, stride_mm,
            stride_mn, Pdbg, dbg_row, BN, DQ, True, CAUSAL, MASK_MODE, PNQ, CEIL, Q_EXP, Q_MANT, EXP_FLUSH,
            DEBUG_P, QK_ACC, PV_ACC, P_CVT,
        )  # fmt: skip
    colscale = tl.load(ColScale + bhk.to(tl.int64) * DV + offs_dv)  # 2**a_v per output column
    out = fp8_finish_o(o_tilde, l, colscale, OUT_MAX)
    optr = Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    optr = optr + offs_m[:, None].to(tl.int64) * stride_om + offs_dv[None, :] * stride_od
    tl.store(optr, out.to(Out.dtype.element_ty), mask=(offs_m[:, None] < Lq) & (offs_dv[None, :] < Dv))
    lse = fp8_finish_lse(l, m)
    tl.store(Lse + bh.to(tl.int64) * Lq + offs_m, lse, mask=offs_m < Lq)


def fp8_operands(
    q_bf16: torch.Tensor,
    k_bf16: torch.Tensor,
    v_bf16: torch.Tensor,
    scale: float,
    group: int,
    *,
    slots: bool,
):
    """(q8, rowscale, k8, v8t, colscale) from the exact pre-pass's bf16 Q^ [B, Hq, LQP, DQ], K^
    [B, Hkv, LKP, DQ], V^ [B, Hkv, LKP, DVP]: the folded bytes, rowscale fp32 [B, Hq, LQP] =
    scale log2(e) 2**(a_q + a_k), colscale fp32 [B, Hkv, DVP] = 2**a_v. `slots`: V^'s keys in the
    Gluon kernel's order (`fold_pass`), else in key order (the `tl` kernel's); no default: either
    kernel computes garbage from the other's order."""
    q8, aq = fold_pass(q_bf16, "row")
    k8, ak = fold_pass(k_bf16, "head")
    v8t, av = fold_pass(v_bf16, "column", slots)
    c = float(torch.tensor(scale * LOG2E, dtype=torch.float32))
    rowscale = pow2_f32(aq + ak.repeat_interleave(group, dim=1)[..., None], c)
    # A factor below fp32's normal range (Q and K rows of magnitude ~1e-25 and less: their scores are
    # 0 in fp32) is 2**-126: scores s c then stay (near) 0, and masked keys -inf (-inf x 0 is NaN).
    rowscale.clamp_(min=FP32_TINY_HOST)
    return q8, rowscale, k8, v8t, pow2_f32(av)


def fp8_operands_via_bf16(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rules: tuple,
    *,
    hadamard: bool,
    scale: float,
    q_len_multiple: int,
    k_len_multiple: int,
    slots: bool,
    passes: tuple = (None, None, None),
):
    """`fp8_operands` of the exact pre-pass's bf16 Q^, K^, V^ of query [B, Hq, Lq, D], key
    [B, Hkv, Lk, D], value [B, Hkv, Lk, Dv]: the same bytes as `fp8_operands_from_inputs`, whose
    arguments it takes, from 25 launches instead of 6: the reference that maker is tested against
    (tests/kernels/test_fold8.py) and the benchmarks' baseline; the plan does not choose it. `passes`: the (Q^, K^,
    V^) bf16 `prepass.PassPlan`s, or None (planned by the pre-pass)."""
    from mxattention.kernels.prepass import prepass_qk, prepass_v

    q_rule, k_rule, v_rule = rules
    q_pass, k_pass, v_pass = passes
    qb = prepass_qk(
        query, q_rule, hadamard=hadamard, len_multiple=q_len_multiple, out_bf16=True, pass_plan=q_pass
    )
    kb = prepass_qk(
        key, k_rule, hadamard=hadamard, len_multiple=k_len_multiple, out_bf16=True, pass_plan=k_pass
    )
    vb = prepass_v(value, v_rule, len_multiple=k_len_multiple, out_bf16=True, pass_plan=v_pass)
    return fp8_operands(qb, kb, vb, scale, query.shape[1] // key.shape[1], slots=slots)


def fp8_operands_from_inputs(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    rules: tuple,
    *,
    hadamard: bool,
    scale: float,
    q_len_multiple: int,
    k_len_multiple: int,
    slots: bool,
    passes: tuple = (None, None, None),
):
    """`fp8_operands` of the exact pre-pass of query [B, Hq, Lq, D], key [B, Hkv, Lk, D], value
    [B, Hkv, Lk, Dv] (rules: the (Q, K, V) scale rules; E2M1), bit for bit, without the bf16 Q^, K^,
    V^ (tests/kernels/test_fold8.py). 6 launches (5 Triton kernels, 1 fill) where the bf16 pre-pass
    and `fp8_operands` take 25 (10 Triton kernels, 15 torch ops: amax / where per anchor reduction,
    rowscale's and colscale's float64 arithmetic), counted by dispatch on the interpreter; and per
    element of (1, 40, 16384, 16384, 128) bf16 (bytes moved / elements of one of Q, K, V) 11.2 bytes
    where they take 25.7 (counted, not measured):

    - one int32 buffer of the K^ head and V^ column anchors, filled with NO_ANCHOR (1 launch);
    - K and V pre-passes writing packed MX bytes (0.53 B/element) and their anchors by atomic maxima
      (`prepass.prepass_k_anchored`, `prepass_v(anchors=)`), reading the inputs (2 B) (2 launches);
    - the Q pre-pass folding each row in registers: E4M3 bytes (1 B), rowscale from the K^ anchors
      (`prepass.prepass_q_fold8`), reading Q (2 B) (1 launch);
    - the K^ and V^ folds from the packed bytes (0.53 B read, 1 B written; V^'s writes colscale)
      (`fold_packed`, 2 launches).

    Per element: Q 2 + 1 (+ rowscale 0.03), K 2 + 0.53 + 0.53 + 1, V the same + 0.06 of atomics:
    11.2 B; the bf16 path: Q 2 + 2 + 2 + 1 (+ 0.03), K 2 + 2 + 2 (anchor pass) + 2 + 1 (+ 0.06), V
    the same (+ 0.25: partial column anchors), ~0.4 in rowscale's float64 ops: 25.7 B.
    `slots`: V^'s key order, as `fp8_operands`. `passes`: the (Q^, K^, V^) `prepass.PassPlan`s, each
    a fast-mode pass (`qk_pass(fold="q")`, `qk_pass(fold="k")`, `v_pass(anchors=True)`; a plan for
    another output raises) or None (planned here). Dense calls only (no varlen, no Q smoothing)."""
    from mxattention.kernels.prepass import padded_dim, prepass_k_anchored, prepass_q_fold8, prepass_v

    q_rule, k_rule, v_rule = rules
    b, hk = key.shape[:2]
    dvp = padded_dim(value.shape[3])
    anchors = torch.full((b * hk * (1 + dvp),), NO_ANCHOR, dtype=torch.int32, device=key.device)
    ak, av = anchors[: b * hk], anchors[b * hk :]
    q_pass, k_pass, v_pass = passes
    kc, ks = prepass_k_anchored(
        key, k_rule, hadamard=hadamard, anchors=ak, len_multiple=k_len_multiple, pass_plan=k_pass
    )
    vc, vs = prepass_v(value, v_rule, len_multiple=k_len_multiple, anchors=av, pass_plan=v_pass)
    q8, rowscale = prepass_q_fold8(
        query, q_rule, hadamard=hadamard, kv_anchors=ak, scale=scale, len_multiple=q_len_multiple,
        pass_plan=q_pass,
    )  # fmt: skip
    k8, _ = fold_packed(kc, ks, ak, columns=False)
    v8t, colscale = fold_packed(vc, vs, av, columns=True, slots=slots)
    return q8, rowscale, k8, v8t, colscale


def fwd_fp8_call(
    q8: torch.Tensor,
    rowscale: torch.Tensor,
    k8: torch.Tensor,
    v8t: torch.Tensor,
    colscale: torch.Tensor,
    *,
    lq: int,
    lk: int,
    dv: int,
    group: int,
    out: torch.Tensor,
    p_rule: tuple[bool, int, int],
    pnq: bool,
    block_n: int,
    is_causal: bool = False,
    mask: torch.Tensor | None = None,
    block_m: int = 128,
    num_warps: int = 8,
    num_stages: int = 2,
    debug_p: torch.Tensor | None = None,
    qk_acc: int | None = None,
    pv_acc: int | None = None,
    p_cvt: bool = False,
) -> tuple[torch.Tensor, tuple[int, int], tuple, dict]:
    """(lse, grid, positional arguments, keyword arguments) of the FP8 kernel's launch on
    `fp8_operands` (see `mx_attention_fwd_fp8`); `codegen.build_fp8` compiles the same launch offline."""
    bsz, hq, lqp, dq = q8.shape
    lkp, dvp = k8.shape[2], v8t.shape[2]
    assert lqp % block_m == 0 and lkp % block_n == 0, (lqp, lkp, block_m, block_n)
    lse = torch.empty((bsz, hq, lq), dtype=torch.float32, device=q8.device)
    if mask is None:
        mask_mode, mask_arg, mstrides = MASK_NONE, lse, (0, 0, 0, 0)
    elif mask.dtype == torch.bool:
        mask_mode, mask_arg, mstrides = MASK_BOOL, mask.view(torch.uint8), mask.stride()
    else:
        mask_mode, mask_arg, mstrides = MASK_ADD, mask, mask.stride()
    ceil, q_exp, q_mant = p_rule
    args = (
        q8, rowscale, k8, v8t, colscale, mask_arg, out, lse, lse if debug_p is None else debug_p,
        lq, lk, dv, hq, group, lqp, lkp, *mstrides, *out.stride(),
    )  # fmt: skip
    kwargs = dict(
        BM=block_m, BN=block_n, DQ=dq, DV=dvp, CAUSAL=is_causal, MASK_MODE=mask_mode, PNQ=pnq, CEIL=ceil,
        Q_EXP=q_exp, Q_MANT=q_mant,
        OUT_MAX=torch.finfo(out.dtype).max if out.dtype in (torch.float16, torch.bfloat16) else 0.0,
        EXP_FLUSH=kernels_interpreted(), DEBUG_P=debug_p is not None, QK_ACC=qk_acc, PV_ACC=pv_acc,
        P_CVT=p_cvt, num_warps=num_warps, num_stages=num_stages, enable_fp_fusion=False,
    )  # fmt: skip
    return lse, (lqp // block_m, bsz * hq), args, kwargs


def mx_attention_fwd_fp8(*operands: torch.Tensor, **kwargs) -> torch.Tensor:
    """Run the FP8 attention kernel on `fp8_operands` (q8, rowscale, k8, v8t, colscale); writes `out`
    [B, Hq, Lq, Dv], returns lse [B, Hq, Lq] (fp32, natural log). Keywords of `fwd_fp8_call`:
    `mask` None or a [B, Hq, Lq, Lk] broadcast view (bool or additive); `qk_acc` / `pv_acc` Triton's
    max_num_imprecise_acc of the two dots (None: the target's default, on sm_90 every k-step of a dot
    in Hopper's FP8 accumulator; 32 adds each k-step to an fp32 accumulator); `p_cvt` P~'s E4M3
    rounding by the hardware conversion (only where `targets.hw_e4m3_cast` says it is exact); `debug_p` fp32
    [B, Hq, Lq, LKP] receiving the folded P^ in P~'s units."""
    lse, grid, args, kw = fwd_fp8_call(*operands, **kwargs)
    _fp8_attention_kernel[grid](*args, **kw)
    return lse
