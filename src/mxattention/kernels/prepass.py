"""The pre-pass: one read of Q, K, V; rotation and MXFP4 cast in registers; packed bytes out.

Exposes `padded_dim`, `padded_len`, `prepass_qk`, `prepass_v`, the fast mode's `prepass_q_fold8`,
`prepass_k_anchored` and `score_scale_parts`, and the pass plans
(`PassPlan`, `qk_pass`, `v_pass`: which kernel and tiles each pass takes, asked once per call by
`plan.plan_call`).

- `prepass_qk(x [B, H, L, D])`: optional normalized Hadamard rotation of the head dim, computed as
  the same fp32 butterflies as `rotation.rotate` (pairs (i, i + h) in blocks of 2h, h = 1, 2, ...,
  then one multiply by 1/sqrt(b)), so the rotated values are bit-identical; then the MXFP4 cast in
  blocks of 32 along the head dim. For packed output the 1/sqrt(b) shares one multiply with the
  block scale (`cast.cast_packed`: exact, with a per-tile fallback). Out: codes
  [B, H, Lp, Dp / 2] uint8 and E8M0 scales [B, H, Lp, Dp / 32] uint8, i.e.
  `mx_quantize(rotate(x), axis=-1)` zero-padded to Dp columns (a power of two >= 32) and Lp rows
  (zero rows: codes 0, scale byte 127).
- `prepass_v(v [B, H, L, Dv])`: the cast in blocks of 32 along the keys. Out: codes
  [B, H, Dvp, Lp / 2] and scales [B, H, Dvp, Lp / 32], i.e. `mx_quantize(v, axis=-2)` padded;
  with elem="e4m3" (MXFP8) one code byte per element, codes [B, H, Dvp, Lp].
- `out_bf16=True` (either): the dequantized values as bf16 instead of bytes, exactly
  `fake_quantize`'s values (each has 2 significant bits and fp32's exponent range, as bf16). The
  attention kernel's Hopper path reads K^ and V^ this way: decoding bytes in its inner loop costs
  more integer work than the two GEMMs leave room for (benchmarks/NOTES.md).

The fast mode's passes (docs/fast_mode.md; `attention_fwd_fp8.fp8_operands_from_inputs`):
`prepass_q_fold8` (Q^ folded into E4M3 bytes in the pass, with each row's score factor),
`prepass_k_anchored` (packed K^ and its heads' fold anchors) and `prepass_v(anchors=)` (packed V^
and its columns' anchors); always the `tl` kernel, planned with `qk_pass(fold=)` / `v_pass(anchors=)`.

On sm_90 the rotated passes at head dim 128 (the Hopper path's bf16 K^ and the packed Q^) run as
the Gluon kernels of `prepass_hopper` instead: same bytes, ~10 % faster each.

The padding lets the attention kernel load whole tiles without bounds checks; padded keys are
masked out of the scores, padded head-dim columns are zeros on both sides of every dot.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch

from mxattention.formats.constants import MX_BLOCK_SIZE
from mxattention.formats.scale_rules import ScaleRule
from mxattention.kernels import builds, prepass_hopper
from mxattention.kernels._triton import sm_count, tl, triton
from mxattention.kernels.cast import bf16_pair_floats, cast_blocks, cast_packed, pack_nibbles
from mxattention.kernels.fold8 import anchor_of, anchor_or_zero, finite_abs, fold_rows, score_factor
from mxattention.kernels.hadamard import hadamard_rows
from mxattention.kernels.launch import launch
from mxattention.kernels.online_softmax import LOG2E
from mxattention.kernels.rules import rule_constants
from mxattention.kernels.specs import BuildFailure, PassKernel
from mxattention.kernels.targets import current_target, hw_e4m3_cast
from mxattention.rotation import rotation_block


def padded_dim(d: int) -> int:
    """The power-of-two tile width (>= 32) that holds a head dim of d."""
    return max(MX_BLOCK_SIZE, 1 << (d - 1).bit_length())


def padded_len(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@triton.jit
def varlen_v_start(k_start, seq):
    """Where sequence `seq`, whose first key is row k_start of the packed K, starts in the varlen
    V^ layout: 32 (ceil(k_start / 32) + seq), a multiple of 32 that leaves room for its keys
    rounded up to 32 before the next sequence's start (`varlen_v_len` rows in all)."""
    return ((k_start + 31) // 32 + seq) * 32


def varlen_v_len(total_k: int, num_seqs: int) -> int:
    """Rows of the varlen V^ layout: past the end of the last sequence's `varlen_v_start` region."""
    return MX_BLOCK_SIZE * (-(-total_k // MX_BLOCK_SIZE) + num_seqs)


@triton.jit
def _load_tile(
    X, pid, bh, L, D, H, stride_b, stride_h, stride_l, stride_d, BL: tl.constexpr, DP: tl.constexpr
):
    """Rows [pid*BL, pid*BL + BL) x columns [0, DP) of head bh of X [B, H, L, D], fp32, zero-padded."""
    b = bh // H
    h = bh % H
    rows = pid * BL + tl.arange(0, BL)
    cols = tl.arange(0, DP)
    ptrs = X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    ptrs = ptrs + rows[:, None].to(tl.int64) * stride_l + cols[None, :] * stride_d
    x = tl.load(ptrs, mask=(rows[:, None] < L) & (cols[None, :] < D), other=0.0).to(tl.float32)
    return x, rows, cols


@triton.jit
def _load_rows(
    X,
    pid,
    bh,
    L,
    D,
    H,
    stride_b,
    stride_h,
    stride_l,
    stride_d,
    BL: tl.constexpr,
    DP: tl.constexpr,
    BF16_PAIRS: tl.constexpr = False,
):
    """As `_load_tile`, laid out one row per thread.

    Loaded as [BL, DP / 8, 8]: Triton's coalescing gives the 8 contiguous elements (16 bytes) to
    one thread and, the two outer axes being equally non-contiguous, spreads the lanes over the rows;
    the chunks of a row repeat in the same thread. Every butterfly of the rotation and every MX
    block of the cast then stays in registers (no shuffles, no shared-memory layout changes: ~40 %
    fewer instructions), at the price of loads that touch 32 rows per instruction. That wins where
    the pass is bound by instructions (packed output, or DP <= 64), not for the bf16 output at
    DP = 128 (benchmarks/NOTES.md, v6).

    BF16_PAIRS (bf16 X with contiguous, even-length rows and even strides, 4-byte aligned): the row
    is read as int32 words of two elements (`cast.bf16_pair_floats`).
    """
    b = bh // H
    h = bh % H
    rows = pid * BL + tl.arange(0, BL)
    if BF16_PAIRS:
        words3 = tl.arange(0, DP // 8)[None, :, None] * 4 + tl.arange(0, 4)[None, None, :]
        ptrs = (
            X.to(tl.pointer_type(tl.int32))
            + b.to(tl.int64) * (stride_b // 2)
            + h.to(tl.int64) * (stride_h // 2)
        )
        ptrs = ptrs + rows[:, None, None].to(tl.int64) * (stride_l // 2) + words3
        w = tl.load(ptrs, mask=(rows[:, None, None] < L) & (words3 < D // 2), other=0)
        lo, hi = bf16_pair_floats(w)
        return tl.reshape(tl.join(lo, hi), [BL, DP]), rows, tl.arange(0, DP)
    cols3 = tl.arange(0, DP // 8)[None, :, None] * 8 + tl.arange(0, 8)[None, None, :]
    ptrs = X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    ptrs = ptrs + rows[:, None, None].to(tl.int64) * stride_l + cols3 * stride_d
    x = tl.load(ptrs, mask=(rows[:, None, None] < L) & (cols3 < D), other=0.0).to(tl.float32)
    return tl.reshape(x, [BL, DP]), rows, tl.arange(0, DP)


@triton.jit
def _load_key_blocks(
    X, pid, bh, L, D, H, stride_b, stride_h, stride_l, stride_d, BL: tl.constexpr, DP: tl.constexpr
):
    """As `_load_tile`, laid out for casts along the keys: each thread holds 16 keys x 8 columns.

    Loaded as [DP / 8, 2, BL / 32, 16, 8] (key = 32 block + 16 half + k): the lanes spread over the
    16-byte column chunks, then over the two halves of a 32-key block; the 16 keys of a half stay
    in one thread, so a block max is 15 in-thread maxima and one exchange between two lanes, and a
    warp's load still reads whole 256-byte rows.
    """
    b = bh // H
    h = bh % H
    keys = (
        tl.arange(0, 2)[None, :, None, None, None] * 16
        + tl.arange(0, BL // 32)[None, None, :, None, None] * 32
        + tl.arange(0, 16)[None, None, None, :, None]
    )
    rows5 = pid * BL + keys
    cols5 = tl.arange(0, DP // 8)[:, None, None, None, None] * 8 + tl.arange(0, 8)[None, None, None, None, :]
    ptrs = X + b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
    ptrs = ptrs + rows5.to(tl.int64) * stride_l + cols5 * stride_d
    x = tl.load(ptrs, mask=(rows5 < L) & (cols5 < D), other=0.0).to(tl.float32)
    # [chunk, half, block, k, e] -> [block, half, k, chunk, e] = [BL // 32, 32, DP]
    x = tl.reshape(tl.permute(x, 2, 1, 3, 0, 4), [BL // 32, 32, DP])
    return x, pid * BL + tl.arange(0, BL), tl.arange(0, DP)


@triton.jit
def _store(ptrs, x, ok, MASKED: tl.constexpr):
    """tl.store, masked by `ok` only if MASKED."""
    if MASKED:
        tl.store(ptrs, x, mask=ok)
    else:
        tl.store(ptrs, x)


@triton.jit
def _qk_prepass_kernel(
    X,
    Codes,
    Scales,
    L,
    D,
    H,
    stride_b,
    stride_h,
    stride_l,
    stride_d,
    L_PAD,
    BL: tl.constexpr,
    DP: tl.constexpr,
    ROW_LAYOUT: tl.constexpr,
    ROTATE: tl.constexpr,
    ROT_LEVELS: tl.constexpr,
    ROT_NORM: tl.constexpr,
    FOLD_E_MAX: tl.constexpr,
    CEIL: tl.constexpr,
    Q_EXP: tl.constexpr,
    Q_MANT: tl.constexpr,
    OUT_BF16: tl.constexpr,
    BF16_PAIRS: tl.constexpr,
    ELEM: tl.constexpr = "e2m1",
    QM=None,
    SMOOTH_BLOCK: tl.constexpr = 0,
    FOLD: tl.constexpr = 0,
    Anchors=None,
    RowScale=None,
    C_MANT=1.0,
    C_EXP=0,
    GROUP=1,
    BY_BITS: tl.constexpr = True,
):
    # FOLD (the fast mode, docs/fast_mode.md): 1 Q^ folded here (`prepass_q_fold8`: E4M3 bytes into
    # Codes, the score factor per row into RowScale, from the KV heads' anchors in Anchors); 2 packed
    # K^ from `cast_blocks`' codes, and this tile's anchor into its head's (`prepass_k_anchored`).
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    if ROW_LAYOUT:
        x, rows, cols = _load_rows(
            X, pid, bh, L, D, H, stride_b, stride_h, stride_l, stride_d, BL, DP, BF16_PAIRS
        )
    else:
        x, rows, cols = _load_tile(X, pid, bh, L, D, H, stride_b, stride_h, stride_l, stride_d, BL, DP)
    if SMOOTH_BLOCK > 0:
        # Q smoothing (docs/design.md, 'Precision ladder and smoothing'): fp32 q - qm, qm the mean of
        # the block of SMOOTH_BLOCK tokens that holds this program's rows (QM [B * H, ceil(L /
        # SMOOTH_BLOCK), D]), the reference's subtraction; padding rows stay 0. One [DP] row per
        # program: a gather per element (int64 addresses, masks) made the pass 2.4x slower.
        tl.static_assert(SMOOTH_BLOCK % BL == 0, "a program's rows lie in one smoothing block")
        nb = (L + SMOOTH_BLOCK - 1) // SMOOTH_BLOCK
        blk = tl.minimum((pid * BL) // SMOOTH_BLOCK, nb - 1)  # (tiles past the last block: zeros below)
        qm = tl.load(QM + (bh.to(tl.int64) * nb + blk) * D + cols, mask=cols < D, other=0.0)
        x = x - qm[None, :]
        if pid * BL + BL > L:  # the last tile
            x = tl.where(rows[:, None] < L, x, 0.0)
    base = bh.to(tl.int64) * L_PAD + rows[:, None].to(tl.int64)
    if OUT_BF16 or ELEM == "e4m3" or FOLD > 0:
        if ROTATE:
            x = hadamard_rows(x, BL, DP, ROT_LEVELS, ROT_NORM)
        x3 = tl.reshape(x, [BL, DP // 32, 32])
        if FOLD == 1:  # the values the bf16 output holds, folded with their row's anchor
            q8, a = fold_rows(x3, CEIL, Q_EXP, Q_MANT, ROW_LAYOUT, BY_BITS)
            tl.store(Codes + base * DP + cols[None, :], q8)
            kv = (bh // H) * (H // GROUP) + (bh % H) // GROUP  # GQA: this query head's KV head
            ak = anchor_or_zero(tl.load(Anchors + kv))
            tl.store(RowScale + bh.to(tl.int64) * L_PAD + rows, score_factor(C_MANT, C_EXP + a + ak))
        else:
            codes, scales, vals = cast_blocks(x3, CEIL, Q_EXP, Q_MANT, 2, ROW_LAYOUT, ELEM)
            if FOLD == 2:  # packed E2M1 bytes and E8M0 bytes of the same cast
                packed = pack_nibbles(tl.reshape(codes, [BL, DP]), BL, DP)
                tl.store(Codes + base * (DP // 2) + tl.arange(0, DP // 2)[None, :], packed)
                tl.store(Scales + base * (DP // 32) + tl.arange(0, DP // 32)[None, :], scales.to(tl.uint8))
                amax = tl.max(tl.max(tl.max(finite_abs(vals), 2), 1), 0)
                tl.atomic_max(Anchors + bh, anchor_of(amax), sem="relaxed")  # read by later launches only
            elif OUT_BF16:
                tl.store(Codes + base * DP + cols[None, :], tl.reshape(vals, [BL, DP]).to(tl.bfloat16))
            else:  # E4M3 bytes, one per element
                tl.store(Codes + base * DP + cols[None, :], tl.reshape(codes, [BL, DP]).to(tl.uint8))
                tl.store(Scales + base * (DP // 32) + tl.arange(0, DP // 32)[None, :], scales.to(tl.uint8))
    else:
        # The rotation's 1/sqrt(b) is folded into the cast's block scale (cast.cast_packed).
        if ROTATE:
            x = hadamard_rows(x, BL, DP, ROT_LEVELS, 1.0)
        norm: tl.constexpr = ROT_NORM if ROTATE else 1.0
        x3 = tl.reshape(x, [BL, DP // 32, 32])
        words, scales = cast_packed(x3, norm, CEIL, Q_EXP, Q_MANT, ROW_LAYOUT, FOLD_E_MAX)
        words_ptr = Codes.to(tl.pointer_type(tl.int32)) + base * (DP // 8) + tl.arange(0, DP // 8)[None, :]
        tl.store(words_ptr, words)
        tl.store(Scales + base * (DP // 32) + tl.arange(0, DP // 32)[None, :], scales.to(tl.uint8))


@triton.jit
def _v_prepass_kernel(
    X,
    Codes,
    Scales,
    L,
    D,
    H,
    stride_b,
    stride_h,
    stride_l,
    stride_d,
    L_PAD,
    Cu,
    SEQ0,
    BL: tl.constexpr,
    DP: tl.constexpr,
    CEIL: tl.constexpr,
    Q_EXP: tl.constexpr,
    Q_MANT: tl.constexpr,
    OUT_BF16: tl.constexpr,
    VARLEN: tl.constexpr = False,
    ELEM: tl.constexpr = "e2m1",
    ANCHORS: tl.constexpr = False,
    Anchors=None,
):
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    # VARLEN (B = 1): keys of sequence program_id(2) + SEQ0, rows Cu[seq]:Cu[seq + 1] of X, cast in
    # blocks of 32 from its first key and written from `varlen_v_start` on, up to its length
    # rounded up to 32 (the rows past it, up to the next sequence's start, are never read).
    out_start = 0
    L_OUT = L_PAD
    if VARLEN:
        seq = SEQ0 + tl.program_id(2)
        start = tl.load(Cu + seq)
        L = tl.load(Cu + seq + 1) - start
        if pid * BL >= L:
            return
        X += start.to(tl.int64) * stride_l
        out_start = varlen_v_start(start, seq)
        L_OUT = (L + 31) // 32 * 32
    if DP <= 128:
        x, rows, cols = _load_key_blocks(X, pid, bh, L, D, H, stride_b, stride_h, stride_l, stride_d, BL, DP)
    else:  # 16 keys x 8 columns of 256 would be 256 values per thread: spills
        x, rows, cols = _load_tile(X, pid, bh, L, D, H, stride_b, stride_h, stride_l, stride_d, BL, DP)
        x = tl.reshape(x, [BL // 32, 32, DP])
    codes, scales, vals = cast_blocks(x, CEIL, Q_EXP, Q_MANT, 1, False, ELEM)
    if ANCHORS:  # the fast mode: this program's column anchors into the head's (`prepass_v`)
        col_max = tl.max(tl.max(finite_abs(vals), 1), 0)
        tl.atomic_max(Anchors + bh.to(tl.int64) * DP + cols, anchor_of(col_max), sem="relaxed")
    if OUT_BF16:
        vals = tl.reshape(vals, [BL, DP])
        rows64 = bh.to(tl.int64) * L_PAD + out_start + rows[:, None].to(tl.int64)
        _store(Codes + rows64 * DP + cols[None, :], vals.to(tl.bfloat16), rows[:, None] < L_OUT, VARLEN)
        return
    codes_t = tl.reshape(tl.permute(codes, 2, 0, 1), [DP, BL])  # keys last, as mx_quantize(axis=-2)
    base = (bh.to(tl.int64) * DP + cols[:, None].to(tl.int64)) * L_PAD + out_start
    if ELEM == "e4m3":  # one byte per code
        keys = pid * BL + tl.arange(0, BL)[None, :]
        _store(Codes + base + keys, codes_t.to(tl.uint8), keys < L_OUT, VARLEN)
    else:
        packed = pack_nibbles(codes_t, DP, BL)
        pairs = pid * BL + 2 * tl.arange(0, BL // 2)[None, :]
        _store(
            Codes + base // 2 + pid * (BL // 2) + tl.arange(0, BL // 2)[None, :],
            packed,
            pairs < L_OUT,
            VARLEN,
        )
    s_t = tl.trans(scales).to(tl.uint8)
    blocks = pid * BL + 32 * tl.arange(0, BL // 32)[None, :]
    _store(
        Scales + base // 32 + pid * (BL // 32) + tl.arange(0, BL // 32)[None, :], s_t, blocks < L_OUT, VARLEN
    )


GRID_Z_MAX = 65535  # CUDA's third grid axis: a varlen V^ launch holds at most this many sequences

# (rows per program, warps) of each pass and layout; H200 sweep (git show f26ce6e:benchmarks/results/raw/
# prepass_sweep_v6_h200.json). Row layout: one row per thread, 32 rows per warp. Frozen: a benchmark
# sweeps them through the planner (`specs.PlanOverrides.prepass_tiles`).
PREPASS_TILES: Mapping[str, tuple[int, int]] = MappingProxyType(
    {
        "qk_rows": (128, 4),
        "qk_tile": (32, 4),
        "qk_tile_256": (16, 4),
        "v_bf16": (32, 1),
        "v_packed": (64, 2),
        "v_256": (32, 4),
    }
)


# The bf16 V^ pass with fewer programs than this per SM takes 2 warps per program (40 heads x 512
# keys: 5.5 -> 4.4 us on the H200, git show f26ce6e:benchmarks/results/raw/prepass_small_kv_v10_h200.json).
V_SMALL_GRID_PER_SM = 8


@dataclass(frozen=True)
class PassPlan:
    """One pre-pass launch: `kernel` "tl" (`prepass`) or "gluon" (`prepass_hopper`, sm_90, D 128;
    a build failure there falls back to the `tl` kernel with one warning), `layout` of the `tl`
    kernel ("rows": one row per thread, "tile", "keys": V's blocks along the keys; "" for Gluon),
    `out` what it writes ("packed" E2M1 bytes, "e4m3" bytes, "bf16" values), `rows` per program
    (Gluon: per tile), `warps` per program, `bf16_pairs` (bf16 rows read as int32 pairs),
    `programs` (Gluon: the K^ pass's grid, the Q^ pass's programs per head; `prepass_hopper.k_tiles`
    / `q_tiles` of the launch's heads), `hw_cast` (the folded Q^ pass: E4M3 bytes by the target's
    conversion, where `targets.HW_E4M3_CAST` lists it, else built from the bits)."""

    kernel: PassKernel
    layout: str
    out: str
    rows: int = 0
    warps: int = 0
    bf16_pairs: bool = False
    programs: int = 0
    hw_cast: bool = False

    def __str__(self) -> str:
        if self.kernel == "gluon":
            return f"gluon -> {self.out}"
        pairs = ", bf16 pairs" if self.bf16_pairs else ""
        cast = " (hardware E4M3 cast)" if self.hw_cast else ""
        return f"tl {self.layout} {self.rows} x {self.warps} warps{pairs} -> {self.out}{cast}"


def _bf16_pairs(x: torch.Tensor) -> bool:
    """Whether x's rows can be read as int32 words of two bf16 elements (`_load_rows`)."""
    strides_even = all(st % 2 == 0 for st in x.stride()[:-1])
    aligned = x.data_ptr() % 4 == 0 and x.shape[-1] % 2 == 0
    return x.dtype == torch.bfloat16 and x.stride(-1) == 1 and strides_even and aligned


def _tile(key: str, lp: int, tiles: Mapping[str, tuple[int, int]] = PREPASS_TILES) -> tuple[int, int]:
    """(rows per program, warps) of `tiles[key]` (default `PREPASS_TILES`), halved until the rows divide lp."""
    assert lp % 32 == 0, "the padded length holds whole MX blocks of 32"
    rows, warps = tiles[key]
    while lp % rows:
        rows, warps = rows // 2, max(1, warps // 2)
    return rows, warps


def qk_pass(
    x: torch.Tensor,
    lp: int,
    *,
    hadamard: bool,
    out_bf16: bool,
    elem: str,
    smoothed: bool,
    gluon: bool = True,
    tiles: Mapping[str, tuple[int, int]] = PREPASS_TILES,
    broken: frozenset[str] = frozenset(),
    heads: int | None = None,
    fold: str = "",
) -> PassPlan:
    """The Q^ / K^ pass of x [B, H, L, D] padded to lp rows: the Gluon kernels where `gluon` and
    `prepass_hopper.usable` (bf16 K^, not smoothed) / `usable_q` (packed Q^, Q smoothing too) take x
    (E2M1), else the
    `tl` kernel, with each row in one thread except where its loads cost more than its
    instructions save (bf16 output at DP = 128) or a row is too long for one thread (DP = 256).
    `tiles`: the `tl` kernels' (rows, warps) table; `broken`: the Gluon passes ("k_bf16", "q_packed")
    that did not build in this process (`builds.record`); `heads`: the launch's B x H
    when it runs on a chunk of x (default: all of x's), which the Gluon passes' tiles follow.
    `fold` (the fast mode, E2M1 only): "q" Q^ folded into E4M3 in the pass (`prepass_q_fold8`,
    out "folded"), "k" packed K^ with its head's anchor (`prepass_k_anchored`, out "packed+anchor"):
    always the `tl` kernel, which alone writes them; `out_bf16` must be False."""
    if fold:
        if fold not in FOLD_OUTS or out_bf16 or elem != "e2m1":
            raise ValueError(f"fold: expected 'q' or 'k' with E2M1 and out_bf16=False, got {fold!r}")
        out, gluon = FOLD_OUTS[fold], False
    else:
        out = "bf16" if out_bf16 else ("e4m3" if elem == "e4m3" else "packed")
    gluon = gluon and elem == "e2m1"
    bh = x.shape[0] * x.shape[1] if heads is None else heads
    if (
        gluon
        and out_bf16
        and not smoothed
        and "k_bf16" not in broken
        and prepass_hopper.usable(x, lp, hadamard)
    ):
        if not x.is_cuda:  # (a test's stand-in): the launch asks the device
            return PassPlan(PassKernel.GLUON, "", out)
        rows, warps, programs = prepass_hopper.k_tiles(bh, lp, x.device)
        return PassPlan(PassKernel.GLUON, "", out, rows, warps, programs=programs)
    if gluon and not out_bf16 and "q_packed" not in broken and prepass_hopper.usable_q(x, lp, hadamard):
        if not x.is_cuda:
            return PassPlan(PassKernel.GLUON, "", out)
        rows, warps, programs = prepass_hopper.q_tiles(bh, lp, x.device)
        return PassPlan(PassKernel.GLUON, "", out, rows, warps, programs=programs)
    dp = padded_dim(x.shape[-1])
    row_layout = dp <= 64 or (dp <= 128 and not out_bf16)
    rows, warps = _tile("qk_rows" if row_layout else ("qk_tile" if dp <= 128 else "qk_tile_256"), lp, tiles)
    hw_cast = fold == "q" and hw_e4m3_cast(current_target(x.device))
    return PassPlan(
        PassKernel.TL, "rows" if row_layout else "tile", out, rows, warps, row_layout and _bf16_pairs(x),
        hw_cast=hw_cast,
    )  # fmt: skip


def v_pass(
    v: torch.Tensor,
    lp: int,
    *,
    out_bf16: bool,
    elem: str,
    heads: int | None = None,
    tiles: Mapping[str, tuple[int, int]] = PREPASS_TILES,
    anchors: bool = False,
) -> PassPlan:
    """The V^ pass of v [B, H, L, Dv] padded to lp keys: blocks of 32 keys in one thread's registers
    up to Dvp 128 (a tile beyond), and for the bf16 output with fewer than V_SMALL_GRID_PER_SM
    programs per SM (short keys) 2 warps per program: more warps each hide more of the latency.
    `heads`: the launch's B x H when it runs on a chunk of v (default: all of v's). `anchors` (the
    fast mode): packed E2M1 V^ with its column anchors (out "packed+column anchors")."""
    bh = v.shape[0] * v.shape[1] if heads is None else heads
    dp = padded_dim(v.shape[-1])
    out = "bf16" if out_bf16 else ("e4m3" if elem == "e4m3" else "packed")
    if anchors:
        if out != "packed":
            raise ValueError(f"anchors: the V^ pass writes them with packed E2M1 output, not {out}")
        out = V_ANCHORED_OUT
    key = "v_256" if dp > 128 else ("v_bf16" if out_bf16 else "v_packed")
    rows, warps = _tile(key, lp, tiles)
    if key == "v_bf16" and v.is_cuda and (lp // rows) * bh < V_SMALL_GRID_PER_SM * sm_count(v.device):
        warps = max(warps, 2)
    return PassPlan(PassKernel.TL, "keys" if dp <= 128 else "tile", out, rows, warps)


# What the fast mode's passes write (`PassPlan.out`): a launch planned for another output is refused.
FOLD_OUTS: Mapping[str, str] = MappingProxyType({"q": "folded", "k": "packed+anchor"})
V_ANCHORED_OUT = "packed+column anchors"


@functools.lru_cache(maxsize=16)  # a few rotation norms per process; a tensor per call costs host time
def fold_e_max(norm: float) -> int:
    """The largest block exponent e for which fp32(norm) * 2**-e is a normal fp32 (`cast.cast_packed`)."""
    as_f32 = struct.unpack("f", struct.pack("f", norm))[0]  # rounded to fp32 as torch rounds it
    return math.floor(126 + math.log2(as_f32))


def _rule_args(rule: str | float | ScaleRule, elem: str = "e2m1") -> dict:
    rc = rule_constants(rule, elem)
    return {"CEIL": rc.ceil, "Q_EXP": rc.q_exp, "Q_MANT": rc.q_mant}


def _default_qk_pass(x: torch.Tensor, lp: int, hadamard: bool, out_bf16: bool, elem: str, smoothed: bool):
    """`qk_pass` as the planner asks it (the Gluon passes that did not build here excluded)."""
    broken = builds.broken_passes()
    return qk_pass(x, lp, hadamard=hadamard, out_bf16=out_bf16, elem=elem, smoothed=smoothed, broken=broken)


def prepass_qk(
    x: torch.Tensor,
    rule: str | float | ScaleRule,
    *,
    hadamard: bool,
    len_multiple: int = 128,
    out_bf16: bool = False,
    elem: str = "e2m1",
    q_mean: tuple[torch.Tensor, int] | None = None,
    pass_plan: PassPlan | None = None,
    slot: tuple[dict, object] | None = None,
):
    """Rotate (optionally) and cast x [B, H, L, D] along D: (codes [B,H,Lp,Dp/2], scales [B,H,Lp,Dp/32]).

    Lp = L rounded up to `len_multiple`; see the module doc for the padding. With `out_bf16`, the
    dequantized values instead, as one bf16 tensor [B, H, Lp, Dp] (exact: 2 significant bits each).
    `elem` "e4m3" (MXFP8): one code byte per element, codes [B, H, Lp, Dp]; bf16 values exact for
    block scales >= 2**-124 (`cast.dequant_e4m3`). `q_mean` = (qm [B, H, ceil(L / block), D] fp32,
    block): Q smoothing, x - qm of each row's block before the rotation. `pass_plan`: the kernel
    and tiles (`qk_pass`, which `plan.plan_call` and the default ask); a planned Gluon pass that
    does not build raises `specs.BuildFailure` (the planner's caller plans the fallback), the
    default one is recorded (`builds.record`) and the `tl` pass runs. `slot`: the
    launch's slot in a cached plan (`launch.launch`).
    """
    b, h, n, d = x.shape
    dp = padded_dim(d)
    lp = padded_len(n, len_multiple)
    if out_bf16:
        codes = torch.empty((b, h, lp, dp), dtype=torch.bfloat16, device=x.device)
        scales = codes
    else:
        codes = torch.empty(
            (b, h, lp, dp // (1 if elem == "e4m3" else 2)), dtype=torch.uint8, device=x.device
        )
        scales = torch.empty((b, h, lp, dp // MX_BLOCK_SIZE), dtype=torch.uint8, device=x.device)
    blk = rotation_block(d) if hadamard else 1  # raises the reference's error for an unsupported d
    levels, norm = blk.bit_length() - 1, 1.0 / math.sqrt(blk)
    planned = pass_plan is not None
    if not planned:
        pass_plan = _default_qk_pass(x, lp, hadamard, out_bf16, elem, q_mean is not None)
    elif pass_plan.out in FOLD_OUTS.values():
        raise ValueError(f"pass_plan: {pass_plan} is a fast-mode pass (prepass_q_fold8 / prepass_k_anchored)")
    if pass_plan.kernel == "gluon":
        tiles = (pass_plan.rows, pass_plan.warps, pass_plan.programs) if pass_plan.programs else None
        try:
            if out_bf16:
                prepass_hopper.prepass_k_bf16(x, codes, lp, levels, norm, _rule_args(rule), tiles, slot=slot)
                return codes
            prepass_hopper.prepass_q_packed(
                x, codes, scales, lp, norm, fold_e_max(norm), _rule_args(rule), q_mean, tiles, slot=slot
            )
            return codes, scales
        except BuildFailure as failure:
            if planned:  # the plan's caller records it and plans the fallback (`plan.replan`)
                raise
            builds.record(failure)
            pass_plan = _default_qk_pass(x, lp, hadamard, out_bf16, elem, q_mean is not None)
    consts = dict(
        OUT_BF16=out_bf16,
        ELEM=elem,
        # The kernel indexes the means as [B * H, nb, D]: a head chunk's view of several batches
        # is not, so it takes a copy (nb x D fp32 per head).
        QM=None if q_mean is None else q_mean[0].contiguous(),
        SMOOTH_BLOCK=0 if q_mean is None else q_mean[1],
        **_rule_args(rule, elem),
    )
    if q_mean is not None:  # QM is a tensor the kernel reads: a positional argument of the launch
        slot = None
    _launch_qk_tl(x, codes, scales, lp, hadamard, pass_plan, consts, slot)
    return codes if out_bf16 else (codes, scales)


def _launch_qk_tl(x, codes, scales, lp: int, hadamard: bool, pass_plan: PassPlan, consts: dict, slot) -> None:
    """Launch `_qk_prepass_kernel` on x [B, H, L, D] padded to lp rows with the tiles of `pass_plan`
    (a `tl` plan) and the output's constants `consts`."""
    b, h, n, d = x.shape
    blk = rotation_block(d) if hadamard else 1
    levels, norm = blk.bit_length() - 1, 1.0 / math.sqrt(blk)
    bl = pass_plan.rows
    geometry = dict(
        BL=bl, DP=padded_dim(d), ROW_LAYOUT=pass_plan.layout == "rows", ROTATE=hadamard, ROT_LEVELS=levels,
        ROT_NORM=norm, FOLD_E_MAX=fold_e_max(norm), BF16_PAIRS=pass_plan.bf16_pairs, num_warps=pass_plan.warps,
    )  # fmt: skip
    args = (x, codes, scales, n, d, h, *x.stride(), lp)
    launch(_qk_prepass_kernel, (lp // bl, b * h), args, geometry | consts, slot)


def _fold_plan(pass_plan: PassPlan | None, default, out: str) -> PassPlan:
    """`pass_plan` (or the default one) if it is a `tl` launch that writes `out`, else a ValueError: a
    plan made for another output must not run a kernel that writes something else."""
    pass_plan = default() if pass_plan is None else pass_plan
    if pass_plan.kernel != PassKernel.TL or pass_plan.out != out:
        raise ValueError(f"pass_plan: expected a tl pass writing {out!r}, got {pass_plan}")
    return pass_plan


@functools.lru_cache(maxsize=64)  # one tensor round trip per new scale, not per call
def score_scale_parts(scale: float) -> tuple[float, int]:
    """(c_mant, c_exp) of c = fp32(scale log2(e)), the fast mode's score constant, for
    `fold8.score_factor`: c = c_mant 2**c_exp with c_mant in [1, 2) (fp32 subnormal c too); for
    c <= 0 (-1.0, 0), whose factors all clamp to 2**-126; Inf (inf, 1000): Inf for every anchor;
    NaN (nan, 0)."""
    c = torch.tensor(scale * LOG2E, dtype=torch.float32).item()  # `fp8_operands`' rounding (Inf past fp32)
    if c != c:
        return c, 0
    if c == math.inf:
        return c, 1000
    if c <= 0:
        return -1.0, 0
    mant, exp = math.frexp(c)
    return 2.0 * mant, exp - 1


def prepass_q_fold8(
    x: torch.Tensor,
    rule: str | float | ScaleRule,
    *,
    hadamard: bool,
    kv_anchors: torch.Tensor,
    scale: float,
    len_multiple: int = 128,
    pass_plan: PassPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The fast mode's Q^ in one pass: (q8 float8_e4m3fn [B, H, Lp, Dp], rowscale fp32 [B, H, Lp]).

    The rotation and MXFP4 cast of `prepass_qk(out_bf16=True)`, then each row's values folded as
    `attention_fwd_fp8.fold_pass(.., "row")` folds the bf16 output (anchor a_q per row), and
    rowscale = max(fp32(scale log2 e) 2**(a_q + a_k), 2**-126) as `fp8_operands`, bit for bit.
    `kv_anchors` int32 [B * Hkv] (contiguous): the KV heads' anchors as `prepass_k_anchored` leaves
    them (NO_ANCHOR for a head of zeros); H is a multiple of Hkv (GQA). E2M1 elements only.
    """
    b, h, n, d = x.shape
    hk = kv_anchors.numel() // b
    if kv_anchors.dtype != torch.int32 or hk == 0 or hk * b != kv_anchors.numel() or h % hk:
        raise ValueError(f"kv_anchors: expected int32 [B * Hkv], Hkv dividing {h}, got {kv_anchors.shape}")
    lp = padded_len(n, len_multiple)
    pass_plan = _fold_plan(
        pass_plan,
        lambda: qk_pass(x, lp, hadamard=hadamard, out_bf16=False, elem="e2m1", smoothed=False, fold="q"),
        FOLD_OUTS["q"],
    )
    dev = x.device
    q8 = torch.empty((b, h, lp, padded_dim(d)), dtype=torch.float8_e4m3fn, device=dev)
    rowscale = torch.empty((b, h, lp), dtype=torch.float32, device=dev)
    c_mant, c_exp = score_scale_parts(scale)
    consts = dict(
        OUT_BF16=False, ELEM="e2m1", FOLD=1, Anchors=kv_anchors, RowScale=rowscale, C_MANT=c_mant, C_EXP=c_exp,
        GROUP=h // hk, BY_BITS=not pass_plan.hw_cast, **_rule_args(rule),
    )  # fmt: skip
    _launch_qk_tl(x, q8, q8, lp, hadamard, pass_plan, consts, None)
    return q8, rowscale


def prepass_k_anchored(
    x: torch.Tensor,
    rule: str | float | ScaleRule,
    *,
    hadamard: bool,
    anchors: torch.Tensor,
    len_multiple: int = 128,
    pass_plan: PassPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`prepass_qk`'s packed (codes, scales) of x [B, H, L, D] (E2M1; from `cast_blocks`' codes, the
    same bytes), and each head's fold anchor (floor(log2 max |x^|) - FOLD_TOP over its finite MX
    values, `attention_fwd_fp8.fold_pass(.., "head")` before its zero-to-0 step) maxed into
    `anchors` int32 [B * H], which the caller fills with `fold8.NO_ANCHOR` first (atomic maxima,
    so the result does not depend on the programs' order)."""
    b, h, n, d = x.shape
    if anchors.dtype != torch.int32 or anchors.numel() != b * h or not anchors.is_contiguous():
        raise ValueError(f"anchors: expected contiguous int32 with {b * h} elements, got {anchors.shape}")
    lp = padded_len(n, len_multiple)
    pass_plan = _fold_plan(
        pass_plan,
        lambda: qk_pass(x, lp, hadamard=hadamard, out_bf16=False, elem="e2m1", smoothed=False, fold="k"),
        FOLD_OUTS["k"],
    )
    dp = padded_dim(d)
    codes = torch.empty((b, h, lp, dp // 2), dtype=torch.uint8, device=x.device)
    scales = torch.empty((b, h, lp, dp // MX_BLOCK_SIZE), dtype=torch.uint8, device=x.device)
    consts = dict(OUT_BF16=False, ELEM="e2m1", FOLD=2, Anchors=anchors, **_rule_args(rule))
    _launch_qk_tl(x, codes, scales, lp, hadamard, pass_plan, consts, None)
    return codes, scales


def prepass_v(
    v: torch.Tensor,
    rule: str | float | ScaleRule,
    *,
    len_multiple: int = 128,
    out_bf16: bool = False,
    varlen: tuple[torch.Tensor, int] | None = None,
    elem: str = "e2m1",
    pass_plan: PassPlan | None = None,
    slot: tuple[dict, object] | None = None,
    anchors: torch.Tensor | None = None,
):
    """Cast v [B, H, L, Dv] along the keys: (codes [B,H,Dvp,Lp/2], scales [B,H,Dvp,Lp/32]).

    `elem` "e4m3" (MXFP8): one code byte per element, codes [B, H, Dvp, Lp] (sign in bit 7).
    With `out_bf16`, the dequantized values instead, as bf16 [B, H, Lp, Dvp] (keys not transposed;
    E4M3 values are exact in bf16 for block scales >= 2**-124, `cast.dequant_e4m3`).
    `varlen` = (cu_seqlens_k, max_seqlen_k): v [1, H, total_k, Dv] is a packed batch whose blocks
    of 32 keys restart at every sequence; Lp = `varlen_v_len` and sequence i starts at row
    `varlen_v_start` (its rows past its length rounded up to 32 are left unwritten). `pass_plan`:
    the tiles (`v_pass`, which `plan.plan_call` and the default ask); `slot`: the launch's slot in a
    cached plan (`launch.launch`). `anchors` (the fast mode; packed E2M1, not varlen): int32
    [B * H * Dvp], filled with `fold8.NO_ANCHOR` by the caller, gets each column's fold anchor
    (`attention_fwd_fp8.fold_pass(.., "column")` before its zero-to-0 step) by atomic maxima.
    """
    b, h, n, d = v.shape
    dp = padded_dim(d)
    if anchors is not None:
        if out_bf16 or elem != "e2m1" or varlen is not None:
            raise ValueError("anchors: only with packed E2M1 output of a dense (not varlen) V")
        if anchors.dtype != torch.int32 or anchors.numel() != b * h * dp or not anchors.is_contiguous():
            raise ValueError(
                f"anchors: expected contiguous int32 with {b * h * dp} elements, got {anchors.shape}"
            )
    lp = padded_len(n, len_multiple) if varlen is None else varlen_v_len(n, varlen[0].numel() - 1)
    if out_bf16:
        codes = torch.empty((b, h, lp, dp), dtype=torch.bfloat16, device=v.device)
        scales = codes
    else:
        codes = torch.empty(
            (b, h, dp, lp // (1 if elem == "e4m3" else 2)), dtype=torch.uint8, device=v.device
        )
        scales = torch.empty((b, h, dp, lp // MX_BLOCK_SIZE), dtype=torch.uint8, device=v.device)
    if anchors is not None:
        pass_plan = _fold_plan(
            pass_plan, lambda: v_pass(v, lp, out_bf16=False, elem=elem, anchors=True), V_ANCHORED_OUT
        )
    elif pass_plan is None:
        pass_plan = v_pass(v, lp, out_bf16=out_bf16, elem=elem)
    elif pass_plan.out == V_ANCHORED_OUT:
        raise ValueError("pass_plan: a plan for the anchored V^ pass needs `anchors`")
    bl, warps = pass_plan.rows, pass_plan.warps
    cu, max_len = (v, n) if varlen is None else varlen
    num_seqs = 1 if varlen is None else cu.numel() - 1
    for seq0 in range(0, num_seqs, GRID_Z_MAX):
        grid = (lp // bl, b * h)
        if varlen is not None:  # programs of the longest sequence, for every sequence
            grid = (-(-max_len // bl), b * h, min(GRID_Z_MAX, num_seqs - seq0))
        consts = dict(
            BL=bl, DP=dp, OUT_BF16=out_bf16, VARLEN=varlen is not None, ELEM=elem, **_rule_args(rule, elem),
            num_warps=warps,
        )  # fmt: skip
        if anchors is not None:  # a tensor by keyword: no direct launch (`launch._runner`)
            consts |= dict(ANCHORS=True, Anchors=anchors)
            slot = None
        args = (v, codes, scales, n, d, h, *v.stride(), lp, cu, seq0)
        launch(_v_prepass_kernel, grid, args, consts, None if slot is None else (slot[0], (slot[1], seq0)))
    return codes if out_bf16 else (codes, scales)
