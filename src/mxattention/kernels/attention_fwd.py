"""Fused MXFP4 attention forward (FlashAttention-2 online softmax), one Triton kernel.

Exposes `mx_attention_fwd` (packed operands from the pre-pass in, (O, lse) out) and `fwd_calls`
(the launches it makes, as data: `codegen` compiles them offline). Which variant a call takes
(matrix path, layout, tiles, element ladders, P_CVT) is its `plan.KernelPlan`'s.

One program owns `BM` query rows of one (batch, head) and walks the key tiles of `BN` = cfg.block_n
keys, in the names of docs/design.md, 'Attention algorithm', and `attention.reference`:

    S       = Q^ K^_j^T * scale (+ mask)      m_new   = max(m, rowmax S)
    alpha   = exp(m - m_new)                  p_tilde = exp(S - m_new)
    p_hat   = Q(p_tilde) per 32 keys          l       = alpha l + rowsum(p_hat if PNQ else p_tilde)
    o_tilde = alpha o_tilde + p_hat V^_j      O       = o_tilde / l,  lse = m + log l

Scores are kept in log2 units (scale * log2 e > 0 folded in, exp2 for exp; `fused_attention`
serves scales <= 0 by negating or zeroing an operand): P~ agrees with the reference's exp to a few
fp32 ulps of the scores. The block max of each 32 keys of p_tilde is exp2 of the
block max of the scores (exp2 is monotone; checked exhaustively on the H200), its scale comes from
the bits (`cast.block_scale`), the rounding from the float adder (`cast.e2m1_round`), so Q(P~) is
decided exactly as `formats.fake_quantize` decides it. The kernel is compiled without fp
contraction, and fmas are written out: P~ must round twice (s * scale, then - m), as the
reference's S - m does, so a row max gets exactly p_tilde = 1 and the floor rule its scale.

P~, V and Q^ / K^ take their own element ladder (constexprs P_ELEM, V_ELEM, QK_ELEM: "e2m1", or
"e4m3" for the MXFP8 presets mxattention-pv8, mxfp8). E4M3 P~ is rounded in the scaled
domain p 2**-e (`cast.elem_round`: its normal binades reach fp32's subnormals), two multiplies per
score more than E2M1 (docs/design.md, 'Precision ladder and smoothing').

The P~ step and the finish (O = O~ / l, lse) are `online_softmax`'s, which the Gluon Hopper forward
calls too.

Speed notes (H200, benchmarks/NOTES.md): the P~ cast is ALU work on the same issue slots as the
softmax, so every instruction per score counts; tiles whose keys are all valid skip the mask select.

Two matrix paths with the same numerics (every product of two dequantized MXFP4 or MXFP8 E4M3
values is exact in fp32; only the fp32 summation order differs):

- "dot_scaled": `tl.dot_scaled(..., "e2m1" / "e4m3", ...)` on the codes and E8M0 bytes (native on
  sm_100+ and CDNA4, emulated by the Triton >= 3.9 interpreter);
- "bf16": codes x 2**e decoded in registers to bf16 (exact; E4M3 for block scales >= 2**-124,
  `cast.dequant_e4m3`) and fed to bf16 tensor cores with fp32 accumulation (Hopper and older).
  The interpreter's tl.dot reads bf16 as raw integers (Triton 3.9), so there the same exact
  values go through an fp32 dot instead.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mxattention.kernels import builds
from mxattention.kernels._triton import kernels_interpreted, tl, triton
from mxattention.kernels.cast import (
    dequant_mx,
    elem_code,
    inv_exp2,
    pack_nibbles,
)
from mxattention.kernels.launch import launch
from mxattention.kernels.online_softmax import LOG2E, LOG2E_C, finish_lse, finish_o, p_tile
from mxattention.kernels.prepass import varlen_v_start
from mxattention.kernels.rules import KERNEL_ELEMS
from mxattention.kernels.specs import BuildFailure, FwdKernel, FwdSpec, MatrixPath, softmax_constexprs

MASK_NONE, MASK_BOOL, MASK_ADD = 0, 1, 2
GRID_Z_MAX = 65535  # CUDA's third grid axis: varlen launches hold at most this many sequences


@triton.jit
def _mask_scores(
    s, offs_m, offs_n, Lq, Lk, mask_base, stride_mm, stride_mn, CAUSAL: tl.constexpr, MASK_MODE: tl.constexpr
):
    """Scores (log2 units) of keys offs_n for rows offs_m with padding, causal and user masks applied."""
    valid = offs_n[None, :] < Lk
    if CAUSAL:
        valid = valid & (offs_n[None, :] <= offs_m[:, None])
    if MASK_MODE != 0:
        mptr = mask_base + offs_m[:, None].to(tl.int64) * stride_mm + offs_n[None, :].to(tl.int64) * stride_mn
        in_range = (offs_m[:, None] < Lq) & (offs_n[None, :] < Lk)
        if MASK_MODE == 1:
            valid = valid & (tl.load(mptr, mask=in_range, other=0) != 0)
        else:
            s = s + tl.load(mptr, mask=in_range, other=0.0).to(tl.float32) * LOG2E_C
    return tl.where(valid, s, float("-inf"))


@triton.jit
def _load(ptrs, ok, other, MASKED: tl.constexpr):
    """tl.load, with `other` where not `ok` only if MASKED (else unmasked)."""
    if MASKED:
        x = tl.load(ptrs, mask=ok, other=other)
    else:
        x = tl.load(ptrs)
    return x


@triton.jit
def _v_codes(Vc, Vs, v_rows, start, Lk, NC: tl.constexpr, MASKED: tl.constexpr, V_ELEM: tl.constexpr):
    """Packed V^ codes [DV, NC / 2] (E4M3: bytes [DV, NC]) and scales [DV, NC / 32] of keys
    [start, start + NC); MASKED: keys past Lk read as zeros (codes 0, scale 1), the bytes of a
    dense call's padding."""
    if V_ELEM == "e4m3":
        keys = start + tl.arange(0, NC)[None, :]
        codes = _load(Vc + v_rows + keys, keys < Lk, 0, MASKED)
    else:
        pairs_in = (start + 2 * tl.arange(0, NC // 2) < Lk)[None, :]
        codes = _load(Vc + v_rows // 2 + (start // 2 + tl.arange(0, NC // 2))[None, :], pairs_in, 0, MASKED)
    blocks_in = (start + 32 * tl.arange(0, NC // 32) < Lk)[None, :]
    scales = _load(
        Vs + v_rows // 32 + (start // 32 + tl.arange(0, NC // 32))[None, :], blocks_in, 127, MASKED
    )
    return codes, scales


@triton.jit
def _v_hat(
    Vx,
    Vc,
    Vs,
    v_base,
    v_rows,
    start,
    Lk,
    NC: tl.constexpr,
    DV: tl.constexpr,
    KV_BF16: tl.constexpr,
    DOT_T: tl.constexpr,
    MASKED: tl.constexpr,
    V_ELEM: tl.constexpr,
):
    """V^ keys [start, start + NC) as a [NC, DV] dot operand (MASKED: zeros past Lk)."""
    if KV_BF16:
        keys = v_base + start + tl.arange(0, NC)[:, None]
        keys_in = start + tl.arange(0, NC)[:, None] < Lk
        return _load(Vx + keys * DV + tl.arange(0, DV)[None, :], keys_in, 0.0, MASKED).to(DOT_T)
    codes, scales = _v_codes(Vc, Vs, v_rows, start, Lk, NC, MASKED, V_ELEM)
    return tl.trans(dequant_mx(codes, scales, DV, NC, V_ELEM).to(DOT_T))


@triton.jit
def _row_codes(Xc, Xs, rows, ok, DQ: tl.constexpr, ELEM: tl.constexpr, MASKED: tl.constexpr):
    """Codes and scales of Q^ / K^ rows [R, 1] (blocks along the head dim): packed E2M1 [R, DQ / 2]
    or E4M3 bytes [R, DQ], scales [R, DQ / 32]; MASKED: rows not `ok` read as zeros (scale 1)."""
    W: tl.constexpr = DQ if ELEM == "e4m3" else DQ // 2
    codes = _load(Xc + rows * W + tl.arange(0, W)[None, :], ok, 0, MASKED)
    scales = _load(Xs + rows * (DQ // 32) + tl.arange(0, DQ // 32)[None, :], ok, 127, MASKED)
    return codes, scales


@triton.jit
def _mx_operand(codes, ELEM: tl.constexpr):
    """A tl.dot_scaled operand of ELEM from its codes: E2M1 packed bytes as they are, E4M3 bytes
    as float8e4nv (uint8 would read as E2M1)."""
    if ELEM == "e4m3":
        codes = codes.to(tl.uint8).to(tl.float8e4nv, bitcast=True)
    return codes


@triton.jit
def _attend_tile(
    m,
    l,
    o_tilde,
    q_op,
    kv,
    side,
    start_n,
    offs_m,
    qk_scale,
    Lq,
    Lk,
    TILE: tl.constexpr,
    MASKING: tl.constexpr,
    CAST: tl.constexpr,
    MMA: tl.constexpr,
):
    """One key tile of Algorithm 1: (m, l, o_tilde) after keys [start_n, start_n + BN).

    Runtime values, grouped as the kernel body builds them: `q_op` = (q_hat, q_codes, q_scales)
    (this program's Q^ rows), `kv` = (Kc, Ks, Vc, Vs, Kx, Vx, k_base, v_base, v_rows) (K^ / V^ of
    its KV head, packed or bf16), `side` = (mask_base, stride_mm, stride_mn, Pdbg, dbg_row,
    corr_ptr) (user mask, Q(P~) debug buffer, Q smoothing correction). Constexprs: TILE = (BM, BN,
    DQ, DV), MASKING = (MASKED, CAUSAL, MASK_MODE, VARLEN), CAST = (PNQ, CEIL, Q_EXP, Q_MANT, P_ELEM,
    P_CVT, EXP_FLUSH) (P~'s ladder and rule; EXP_FLUSH: `cast.exp2_ftz`'s explicit flush), MMA =
    (DOT_SCALED, DOT_T, KV_BF16, QK_ELEM, V_ELEM, DEBUG_P, SMOOTH_Q) (the matrix path, operand ladders, and the optional side outputs / inputs).

    MASKED = False is the fast path for tiles whose keys are all valid for every row (no padding,
    causal or user mask): the scores skip the select, the only difference. VARLEN and MASKED: the
    keys past Lk belong to the next sequence (or to no one), so K^ and V^ load zeros there.
    """
    BM: tl.constexpr = TILE[0]
    BN: tl.constexpr = TILE[1]
    DQ: tl.constexpr = TILE[2]
    DV: tl.constexpr = TILE[3]
    MASKED: tl.constexpr = MASKING[0]
    CAUSAL: tl.constexpr = MASKING[1]
    MASK_MODE: tl.constexpr = MASKING[2]
    VARLEN: tl.constexpr = MASKING[3]
    PNQ: tl.constexpr = CAST[0]
    P_ELEM: tl.constexpr = CAST[4]
    DOT_SCALED: tl.constexpr = MMA[0]
    DOT_T: tl.constexpr = MMA[1]
    KV_BF16: tl.constexpr = MMA[2]
    QK_ELEM: tl.constexpr = MMA[3]
    V_ELEM: tl.constexpr = MMA[4]
    DEBUG_P: tl.constexpr = MMA[5]
    SMOOTH_Q: tl.constexpr = MMA[6]
    q_hat, q_codes, q_scales = q_op
    Kc, Ks, Vc, Vs, Kx, Vx, k_base, v_base, v_rows = kv
    mask_base, stride_mm, stride_mn, Pdbg, dbg_row, corr_ptr = side
    CLIP: tl.constexpr = VARLEN and MASKED
    offs_n = start_n + tl.arange(0, BN)
    k_rows = k_base + offs_n[:, None]
    k_in = offs_n[:, None] < Lk
    if not KV_BF16:
        k_codes, k_scales = _row_codes(Kc, Ks, k_rows, k_in, DQ, QK_ELEM, CLIP)
    if DOT_SCALED:
        q_op, k_op = _mx_operand(q_codes, QK_ELEM), _mx_operand(tl.trans(k_codes), QK_ELEM)
        s = tl.dot_scaled(q_op, q_scales, QK_ELEM, k_op, k_scales, QK_ELEM)
    elif KV_BF16:
        k_hat = _load(Kx + k_rows * DQ + tl.arange(0, DQ)[None, :], k_in, 0.0, CLIP).to(DOT_T)
        s = tl.dot(q_hat, tl.trans(k_hat))
    else:
        s = tl.dot(q_hat, tl.trans(dequant_mx(k_codes, k_scales, BN, DQ, QK_ELEM).to(DOT_T)))
    if SMOOTH_Q:
        # Q smoothing's correction qm K^T (unscaled, as the scores: one [BN] vector per query block
        # and key tile, `smoothing.smoothing_correction`), so the scale stays one multiply below.
        s = s + tl.load(corr_ptr + offs_n)[None, :]
    if MASKED and MASK_MODE == 2:
        # An additive mask is added in log2 units, so these scores are scaled first.
        s = s * qk_scale
        s = _mask_scores(s, offs_m, offs_n, Lq, Lk, mask_base, stride_mm, stride_mn, CAUSAL, MASK_MODE)
        c = 1.0
    else:
        if MASKED:
            s = _mask_scores(s, offs_m, offs_n, Lq, Lk, mask_base, stride_mm, stride_mn, CAUSAL, MASK_MODE)
        c = qk_scale

    # The P~ step of both forwards (`online_softmax.p_tile`).
    m_new, alpha, p3, p_hat3, two_e = p_tile(s, m, c, CAST)
    p_hat = tl.reshape(p_hat3, [BM, BN])
    if DEBUG_P:
        tl.store(Pdbg + dbg_row + offs_n[None, :], p_hat, mask=offs_m[:, None] < Lq)
    if not PNQ:
        l = alpha * l + tl.sum(tl.reshape(p3, [BM, BN]), 1)
    o_tilde = o_tilde * alpha[:, None]

    if DOT_SCALED:
        v_codes, v_scales = _v_codes(Vc, Vs, v_rows, start_n, Lk, BN, CLIP, V_ELEM)
        # p_hat / 2**e is exactly on the P~ ladder (nonnegative: the code is the magnitude code);
        # P~ <= 1 keeps two_e within inv_exp2's range: the inverse and the product are exact.
        code = elem_code(tl.reshape(p_hat3 * inv_exp2(two_e)[:, :, None], [BM, BN]), P_ELEM)
        if P_ELEM == "e2m1":
            code = pack_nibbles(code, BM, BN)
        p_scales = (two_e.to(tl.int32, bitcast=True) >> 23).to(tl.uint8)
        v_op = _mx_operand(tl.trans(v_codes), V_ELEM)
        o_tilde = tl.dot_scaled(_mx_operand(code, P_ELEM), p_scales, P_ELEM, v_op, v_scales, V_ELEM, o_tilde)
    else:
        v_hat = _v_hat(Vx, Vc, Vs, v_base, v_rows, start_n, Lk, BN, DV, KV_BF16, DOT_T, CLIP, V_ELEM)
        o_tilde = tl.dot(p_hat.to(DOT_T), v_hat, o_tilde)
    if PNQ:
        # Placed after the PV wgmma is issued: this sum waits for the cast, and here its additions
        # overlap the tensor cores. Across the 4 blocks first (in-thread), then along the keys:
        # fewer shuffles, and l stays in the layout of m (benchmarks/NOTES.md, v5).
        l = alpha * l + tl.sum(tl.sum(p_hat3, 1), 1)
    return m_new, l, o_tilde


@triton.jit
def _mx_attention_fwd_kernel(
    Qc,
    Qs,
    Kc,
    Ks,
    Vc,
    Vs,
    Mask,
    Out,
    Lse,
    Pdbg,
    Kx,
    Vx,
    qk_scale,
    Lq,
    Lk,
    Dv,
    H,
    GROUP,
    LQP,
    LKP,
    LVP,
    CuQ,
    CuK,
    Corr,
    SEQ0,
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
    DOT_SCALED: tl.constexpr,
    DEBUG_P: tl.constexpr,
    DOT_T: tl.constexpr,
    KV_BF16: tl.constexpr,
    OUT_MAX: tl.constexpr = 0.0,
    VARLEN: tl.constexpr = False,
    P_ELEM: tl.constexpr = "e2m1",
    V_ELEM: tl.constexpr = "e2m1",
    P_CVT: tl.constexpr = False,
    QK_ELEM: tl.constexpr = "e2m1",
    SMOOTH_Q_BLOCK: tl.constexpr = 0,
    EXP_FLUSH: tl.constexpr = False,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    bhk = b * (H // GROUP) + h // GROUP  # GQA: the kv head, no copy
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_dv = tl.arange(0, DV)

    # VARLEN (B = 1): this program's sequence is program_id(2) + SEQ0; its rows start at q_start of
    # Q^ / Out / Lse (Lq = total_q, the lse row stride) and its keys at k_start of K^ and at
    # v_start of V^, whose blocks of 32 keys restart at every sequence (`varlen_v_start`).
    lq, lk, q_start, k_start, v_start = Lq, Lk, 0, 0, 0
    if VARLEN:
        seq = SEQ0 + tl.program_id(2)
        q_start = tl.load(CuQ + seq)
        lq = tl.load(CuQ + seq + 1) - q_start
        k_start = tl.load(CuK + seq)
        lk = tl.load(CuK + seq + 1) - k_start
        v_start = varlen_v_start(k_start, seq)
        if pid_m * BM >= lq:
            return

    q_rows = bh.to(tl.int64) * LQP + q_start + offs_m[:, None]
    q_in = offs_m[:, None] < lq
    q_codes, q_scales = _row_codes(Qc, Qs, q_rows, q_in, DQ, QK_ELEM, VARLEN)
    q_hat = q_codes  # unused by dot_scaled
    if not DOT_SCALED:
        q_hat = dequant_mx(q_codes, q_scales, BM, DQ, QK_ELEM).to(DOT_T)

    k_base = bhk.to(tl.int64) * LKP + k_start
    v_base = bhk.to(tl.int64) * LVP + v_start
    v_rows = (bhk.to(tl.int64) * DV + offs_dv[:, None]) * LVP + v_start
    dbg_row = (bh.to(tl.int64) * Lq + offs_m[:, None]) * LKP
    m = tl.full([BM], float("-inf"), tl.float32)
    l = tl.zeros([BM], tl.float32)
    o_tilde = tl.zeros([BM, DV], tl.float32)
    mask_base = Mask + b.to(tl.int64) * stride_mb + h.to(tl.int64) * stride_mh
    # Q smoothing: this program's rows lie in one block of SMOOTH_Q_BLOCK queries (BM divides it);
    # its correction row of Corr [B * H, ceil(Lq / SMOOTH_Q_BLOCK), LKP].
    corr_ptr = Corr
    if SMOOTH_Q_BLOCK > 0:
        nbq = (Lq + SMOOTH_Q_BLOCK - 1) // SMOOTH_Q_BLOCK
        corr_ptr = Corr + (bh.to(tl.int64) * nbq + (pid_m * BM) // SMOOTH_Q_BLOCK) * LKP

    # Keys [0, full) are valid for every row of this program: no select on their scores.
    hi = lk
    full = 0
    if MASK_MODE == 0:
        full = lk // BN * BN
    if CAUSAL:
        hi = tl.minimum(lk, (pid_m + 1) * BM)
        full = tl.minimum(full, (pid_m * BM + 1) // BN * BN)
    q_op = (q_hat, q_codes, q_scales)
    kv = (Kc, Ks, Vc, Vs, Kx, Vx, k_base, v_base, v_rows)
    side = (mask_base, stride_mm, stride_mn, Pdbg, dbg_row, corr_ptr)
    # The constexpr groups are written out at each call: a tuple held in a variable is no longer
    # constexpr (its strings would become tensors).
    for start_n in tl.range(0, full, BN):
        m, l, o_tilde = _attend_tile(
            m, l, o_tilde, q_op, kv, side, start_n, offs_m, qk_scale, lq, lk,
            (BM, BN, DQ, DV), (False, CAUSAL, MASK_MODE, VARLEN), (PNQ, CEIL, Q_EXP, Q_MANT, P_ELEM, P_CVT, EXP_FLUSH),
            (DOT_SCALED, DOT_T, KV_BF16, QK_ELEM, V_ELEM, DEBUG_P, SMOOTH_Q_BLOCK > 0),
        )  # fmt: skip
    # The masked tail (a tile or two, more on the causal diagonal) runs unpipelined: pipelining
    # it too puts copies of o_tilde between wgmmas and ptxas then serializes every wgmma.
    for start_n in tl.range(full, hi, BN, num_stages=1):
        m, l, o_tilde = _attend_tile(
            m, l, o_tilde, q_op, kv, side, start_n, offs_m, qk_scale, lq, lk,
            (BM, BN, DQ, DV), (True, CAUSAL, MASK_MODE, VARLEN), (PNQ, CEIL, Q_EXP, Q_MANT, P_ELEM, P_CVT, EXP_FLUSH),
            (DOT_SCALED, DOT_T, KV_BF16, QK_ELEM, V_ELEM, DEBUG_P, SMOOTH_Q_BLOCK > 0),
        )  # fmt: skip

    out = finish_o(o_tilde, l, OUT_MAX)
    optr = Out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    optr = optr + (q_start + offs_m[:, None]).to(tl.int64) * stride_om + offs_dv[None, :] * stride_od
    tl.store(optr, out.to(Out.dtype.element_ty), mask=(offs_m[:, None] < lq) & (offs_dv[None, :] < Dv))
    lse = finish_lse(l, m)
    tl.store(Lse + bh.to(tl.int64) * Lq + q_start + offs_m, lse, mask=offs_m < lq)


@dataclass(frozen=True)
class FwdCall:
    """One launch of the kernel: grid, positional arguments, constexprs and compile options (`spec`:
    the plan's launch spec they come from)."""

    grid: tuple[int, ...]
    args: tuple
    constants: dict
    num_warps: int
    num_stages: int
    options: tuple[tuple[str, int], ...] = ()
    spec: FwdSpec | None = None


def mx_attention_fwd(
    q_packed,
    k_packed,
    v_packed,
    *,
    spec: FwdSpec | None = None,
    slot: tuple[dict, object] | None = None,
    **kwargs,
) -> torch.Tensor:
    """Run the attention kernel on pre-pass outputs; writes `out` [B, Hq, Lq, Dv], returns lse
    [B, Hq, Lq]. With `spec` (a plan's `KernelPlan.fwd`) the keyword arguments are `fwd_launches`'s
    (tensors and their lengths; a build past shared memory raises `specs.BuildFailure` for the
    plan's caller); without, `fwd_calls`'s (the spec is planned from them, and a build past shared
    memory is recorded by the planner and planned again with one stage fewer). `slot`: the launch's
    slot in a cached plan (`launch.launch`)."""
    while True:
        if spec is None:
            lse, calls = fwd_calls(q_packed, k_packed, v_packed, **kwargs)
        else:
            lse, calls = fwd_launches(spec, q_packed, k_packed, v_packed, **kwargs)
        try:
            for i, call in enumerate(calls):
                _launch(call, q_packed[0].device, None if slot is None else (slot[0], (slot[1], i)))
            return lse
        except BuildFailure as failure:
            if spec is not None:  # a plan's spec: its caller (`fused.run_plan`) plans again
                raise
            builds.record(failure)  # fwd_calls plans one stage fewer (`builds.fitted`)


def fwd_calls(
    q_packed: tuple[torch.Tensor, torch.Tensor],
    k_packed: tuple[torch.Tensor, torch.Tensor] | torch.Tensor,
    v_packed: tuple[torch.Tensor, torch.Tensor] | torch.Tensor,
    *,
    lq: int,
    lk: int,
    dv: int,
    group: int,
    out: torch.Tensor,
    p_rule: tuple[bool, int, int],
    pnq: bool,
    block_n: int,
    scale: float,
    is_causal: bool = False,
    mask: torch.Tensor | None = None,
    matrix_path: str = "bf16",
    block_m: int = 128,
    num_warps: int = 8,
    num_stages: int = 2,
    compile_options: tuple[tuple[str, int], ...] = (),
    debug_p: torch.Tensor | None = None,
    varlen: tuple[torch.Tensor, torch.Tensor, int] | None = None,
    p_elem: str = "e2m1",
    v_elem: str = "e2m1",
    qk_elem: str = "e2m1",
    p_cvt: bool = False,
    smooth_q: tuple[torch.Tensor, int] | None = None,
) -> tuple[torch.Tensor, list[FwdCall]]:
    """(lse [B, Hq, Lq], the kernel launches) for pre-pass outputs; `mx_attention_fwd` runs them,
    which writes `out` [B, Hq, Lq, Dv] and lse.

    `q_packed` = (codes [B, Hq, LQP, DQ/2], scales), `k_packed` likewise with Hkv heads, `v_packed` =
    (codes [B, Hkv, DVP, LKP/2], scales [B, Hkv, DVP, LKP/32]) (see `prepass`); LQP a multiple of
    `block_m`, LKP of `block_n`. `mask`: None or a [B, Hq, Lq, Lk] (broadcast) view, bool (True =
    attend) or additive float in natural-log units. `p_rule` = (CEIL, Q_EXP, Q_MANT) of P~'s rule on
    its element ladder `p_elem` ("e2m1" or "e4m3", `rules.rule_constants(rule, p_elem)`); `v_elem`
    is V^'s ladder (E4M3 codes: one byte each, [B, Hkv, DVP, LKP]), `qk_elem` Q^'s and K^'s (E4M3:
    codes [B, H, L, DQ]). `smooth_q` = (corr [B, Hq, ceil(Lq / block), LKP] fp32, block): Q
    smoothing's correction qm K^T (unscaled) per query block and key, zero past Lk; block a
    multiple of `block_m` (dense calls only).
    `debug_p`: an fp32 [B, Hq, Lq, LKP] buffer that receives Q(P~) of every tile computed.
    `k_packed` / `v_packed` may instead be single bf16 tensors of the dequantized values, K^ [B, Hkv,
    LKP, DQ] and V^ [B, Hkv, LKP, DVP] (`prepass_*(..., out_bf16=True)`), for the "bf16" path only.
    `compile_options`: backend options of the build (`targets.FwdTiles.options`). `p_cvt`: E4M3
    P~ by the hardware cast (`KernelPlan.p_cvt`, where targets.HW_E4M3_CAST lists the GPU).
    `num_stages` is lowered automatically when the compiled kernel would not fit in shared memory.
    `varlen` = (cu_seqlens_q, cu_seqlens_k, max_seqlen_q): a packed batch (B = 1, no mask, no
    debug_p); lq / lk are then total_q / total_k, `out` [1, Hq, total_q, Dv] (any strides), the
    returned lse [1, Hq, total_q]; Q^ / K^ are in token order, V^ in the `prepass.varlen_v_start`
    layout (`prepass_v(..., varlen=...)`). One launch per GRID_Z_MAX sequences.
    """
    kv_bf16 = isinstance(k_packed, torch.Tensor)
    spec = tl_fwd_spec(
        block_m=block_m,
        block_n=block_n,
        dq=q_packed[0].shape[3] * (1 if qk_elem == "e4m3" else 2),
        dvp=v_packed.shape[3] if kv_bf16 else v_packed[0].shape[2],
        p_rule=p_rule,
        pnq=pnq,
        matrix_path=matrix_path,
        kv_bf16=kv_bf16,
        out_dtype=out.dtype,
        num_warps=num_warps,
        num_stages=num_stages,
        compile_options=compile_options,
        is_causal=is_causal,
        mask_dtype=None if mask is None else mask.dtype,
        debug_p=debug_p is not None,
        varlen=varlen is not None,
        p_elem=p_elem,
        v_elem=v_elem,
        qk_elem=qk_elem,
        p_cvt=p_cvt,
        smooth_q_block=0 if smooth_q is None else smooth_q[1],
    )
    kw = dict(lq=lq, lk=lk, dv=dv, group=group, out=out, scale=scale, mask=mask, debug_p=debug_p)
    return fwd_launches(spec, q_packed, k_packed, v_packed, **kw, varlen=varlen, smooth_q=smooth_q)


def fwd_launches(
    spec: FwdSpec,
    q_packed: tuple[torch.Tensor, torch.Tensor],
    k_packed: tuple[torch.Tensor, torch.Tensor] | torch.Tensor,
    v_packed: tuple[torch.Tensor, torch.Tensor] | torch.Tensor,
    *,
    lq: int,
    lk: int,
    dv: int,
    group: int,
    out: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None = None,
    debug_p: torch.Tensor | None = None,
    varlen: tuple[torch.Tensor, torch.Tensor, int] | None = None,
    smooth_q: tuple[torch.Tensor, int] | None = None,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, list[FwdCall]]:
    """(lse, the launches) of `spec` (`tl_fwd_spec`) on these tensors (see `fwd_calls`): reads
    the spec and the tensors, nothing else. `lse`: a contiguous fp32 [B, Hq, Lq] to write (default
    a new one)."""
    c = spec.constants
    block_m, block_n, v_elem = c["BM"], c["BN"], c["V_ELEM"]
    qc, qs = q_packed
    kv_bf16 = isinstance(k_packed, torch.Tensor)
    if kv_bf16:
        kx, vx = k_packed, v_packed
        kc = ks = vc = vs = kx
        lkp, lvp = kx.shape[2], vx.shape[2]
    else:
        (kc, ks), (vc, vs) = k_packed, v_packed
        kx = vx = qc
        lkp, lvp = kc.shape[2], vc.shape[3] * (1 if v_elem == "e4m3" else 2)
    bsz, hq, lqp, _ = qc.shape
    # Preconditions (the spec comes from a `plan.KernelPlan`, whose options plan_call checked; the
    # inputs from attention.inputs / attention.varlen): asserted, not re-checked for the user.
    assert spec.kernel is FwdKernel.TL and kv_bf16 == c["KV_BF16"], (spec.kernel, kv_bf16)
    assert varlen is not None or not (lqp % block_m or lkp % block_n), (lqp, lkp, block_m, block_n)
    assert varlen is None or (mask is None and debug_p is None and bsz == 1 and smooth_q is None)
    assert (mask is None) == (c["MASK_MODE"] == MASK_NONE) and (debug_p is not None) == c["DEBUG_P"]
    assert (0 if smooth_q is None else smooth_q[1]) == c["SMOOTH_Q_BLOCK"]
    if lse is None:
        lse = torch.empty((bsz, hq, lq), dtype=torch.float32, device=qc.device)
    if mask is None:
        mask_arg, mstrides = qc, (0, 0, 0, 0)
    else:
        mask_arg, mstrides = (mask.view(torch.uint8) if mask.dtype == torch.bool else mask), mask.stride()
    cu_q, cu_k, max_q = varlen if varlen is not None else (lse, lse, 0)
    head = (
        qc,
        qs,
        kc,
        ks,
        vc,
        vs,
        mask_arg,
        out,
        lse,
        debug_p if debug_p is not None else lse,
        kx,
        vx,
        scale * LOG2E,
        lq,
        lk,
        dv,
        hq,
        group,
        lqp,
        lkp,
        lvp,
        cu_q,
        cu_k,
        lse if smooth_q is None else smooth_q[0],
    )
    tail = (*mstrides, *out.stride())  # SEQ0, the first sequence of a launch, goes between
    constants, warps, stages, opts = c, spec.num_warps, spec.num_stages, spec.options
    if varlen is None:
        return lse, [
            FwdCall((lqp // block_m, bsz * hq), (*head, 0, *tail), constants, warps, stages, opts, spec)
        ]
    num_seqs = cu_q.numel() - 1
    calls = []
    for seq0 in range(0, num_seqs, GRID_Z_MAX):
        grid = (-(-max_q // block_m), hq, min(GRID_Z_MAX, num_seqs - seq0))
        calls.append(FwdCall(grid, (*head, seq0, *tail), constants, warps, stages, opts, spec))
    return lse, calls


def _launch(call: FwdCall, device: torch.device, slot: tuple[dict, object] | None = None) -> None:
    """Launch `call` as its spec says. A build that overflows shared memory raises
    `specs.BuildFailure(spec)` (stages > 1): the planner records it and plans one stage fewer
    (`builds.fitted`); nothing here remembers it."""
    from triton.runtime.errors import OutOfResources

    spec = call.spec
    kw = (
        spec.launch_kwargs
        if call.num_stages == spec.num_stages
        else {**spec.launch_kwargs, "num_stages": call.num_stages}
    )
    try:
        launch(_mx_attention_fwd_kernel, call.grid, call.args, kw, slot)
    except OutOfResources as err:
        if call.num_stages <= 1:
            raise
        raise BuildFailure(spec, f"{type(err).__name__}: {err}") from err


def tl_fwd_spec(
    *,
    block_m: int,
    block_n: int,
    dq: int,
    dvp: int,
    p_rule: tuple[bool, int, int],
    pnq: bool,
    matrix_path: str,
    kv_bf16: bool,
    out_dtype: torch.dtype,
    num_warps: int,
    num_stages: int,
    compile_options: tuple[tuple[str, int], ...] = (),
    is_causal: bool = False,
    mask_dtype: torch.dtype | None = None,
    debug_p: bool = False,
    varlen: bool = False,
    p_elem: str = "e2m1",
    v_elem: str = "e2m1",
    qk_elem: str = "e2m1",
    p_cvt: bool = False,
    smooth_q_block: int = 0,
    interpreted: bool | None = None,
) -> FwdSpec:
    """The `attention_fwd` launch of a call: every constexpr decided here (`dq` Q^ / K^'s padded head
    dim, `dvp` V^'s; `mask_dtype` None for no mask; `interpreted` None: `kernels_interpreted()`, which
    sets fp32 products (DOT_T) and the interpreter's non-flushing exp2 (EXP_FLUSH))."""
    if interpreted is None:
        interpreted = kernels_interpreted()
    path = MatrixPath.parse(matrix_path, "matrix_path")
    assert not (kv_bf16 and path is not MatrixPath.BF16), (path, kv_bf16)
    assert all(e in KERNEL_ELEMS for e in (p_elem, v_elem, qk_elem)), (p_elem, v_elem, qk_elem)
    assert smooth_q_block % block_m == 0, (smooth_q_block, block_m)
    mask_mode = MASK_NONE if mask_dtype is None else (MASK_BOOL if mask_dtype == torch.bool else MASK_ADD)
    constexprs = dict(
        BM=block_m,
        BN=block_n,
        DQ=dq,
        DV=dvp,
        CAUSAL=is_causal,
        MASK_MODE=mask_mode,
        **softmax_constexprs(p_rule, pnq, out_dtype),
        DOT_SCALED=path is MatrixPath.DOT_SCALED,
        DEBUG_P=debug_p,
        # The interpreter multiplies in fp32 (its bf16 dot rounds the products).
        DOT_T=tl.float32 if interpreted else tl.bfloat16,
        KV_BF16=kv_bf16,
        VARLEN=varlen,
        P_ELEM=p_elem,
        V_ELEM=v_elem,
        P_CVT=p_cvt,
        QK_ELEM=qk_elem,
        SMOOTH_Q_BLOCK=smooth_q_block,
        # The interpreter's exp2 keeps subnormals; NVIDIA's flushes them (`cast.exp2_ftz`).
        EXP_FLUSH=interpreted,
    )
    return builds.fitted(
        FwdSpec(FwdKernel.TL, tuple(constexprs.items()), num_warps, num_stages, tuple(compile_options))
    )
