"""The fast mode's forward on Hopper (sm_90a): FP8 wgmma in the warp-specialized Gluon scheme.

Exposes `fast_gluon_reason` (why a fast-mode call cannot take this kernel, None if it can),
`fast_gluon_launch` (the launch, as data, on `attention_fwd_fp8.fp8_operands`) and
`mx_attention_fwd_hopper_fp8` (run it: writes O, returns lse).

It computes what `attention_fwd_fp8._fp8_attention_kernel` (the `tl` FP8 kernel, docs/fast_mode.md)
computes, for the calls the exact path's Gluon forward serves (`attention_fwd_hopper`): head dims
DQ = DV = 128, BN = 128 keys per tile, no causal mask, no user mask, no debug_p (the fast mode has
no varlen kernel and no Q smoothing), PNQ on; any lengths, GQA. The same operations: S = F_q F_k^T
by FP8 (e4m3) wgmma m64n128k32 from a fresh accumulator, the softmax step and P~'s E2M1 rounding
times 2**8 (`attention_fwd_fp8.fp8_p_tile`, the `tl` kernel's own function), P~'s E4M3 rounding
(software, or the hardware conversion where the plan says `P_CVT`), l the fp32 sum of the values
the MMA reads (PNQ, as the `tl` kernel sums them, in another fp32 order: each thread's partial sums
across the key loop, `L_PARTIAL`; the FP8 accumulator's sums moved the weights' row sums off 1 by up
to 3.6e-3, against issue 29's bound of 1e-3), each tile's
P~ V^ in a fresh fp32 accumulator added by one fma `O~ = O~ alpha + acc`, then O = O~ / l per
column times 2**a_v (`attention_fwd_fp8.fp8_finish_o`). The P~ V^ products of a k-step (32 keys)
come in `key_slot` order, so they equal the `tl` kernel's up to how the FP8 accumulator treats
that order (tests/kernels/test_attention_fwd_fp8_gluon.py).

Structure (one CTA per 128 query rows of one (batch, head)), as `attention_fwd_hopper`, whose
`KVRing` and `Epilogue` aggregates it reuses:

- a producer partition (1 warp) brings K^_j ([BN keys, DQ] bytes, rows of the folded K^) and V^_j
  ([DV, BN keys] bytes: the fold pass writes V^ transposed, keys contiguous, so both wgmma B
  operands are K-major as FP8 wgmma requires) by TMA into a ring of STAGES slots (16 KiB each,
  half the bf16 path's);
- two consumer partitions (one warpgroup each) own 64 query rows each: their folded Q^ bytes in
  shared memory, the per-row score factor c = scale log2(e) 2**(a_q + a_k) in registers, (m, l,
  O~) in registers. P~ is the A operand of the P~ V^ wgmma from registers (8-bit dot operand,
  k_width 4).
- P~ leaves the accumulator of S as the 8-bit A operand without lane exchanges: the fold pass
  stores V^'s keys in the order a thread holds them (`attention_fwd_fp8.key_slot`), `_key_slots`
  permutes P~'s columns likewise, and the conversion to the A operand is a byte permutation
  within each thread.
- per key tile j: S_j, its softmax and P~_j's row sums, then P~_j V^_j, O~ = fma(O~, alpha_j,
  P~_j V^_j); the other consumer's wgmmas run under each softmax. By default (OVERLAP 2, `_ahead8`)
  S_{j+1} is issued before S_j's softmax and runs under it; OVERLAP 1 (S_{j+1} in flight beside
  P~_j V^_j) and off (`_tile8`: each wgmma waited for) remain as variants to time (see OVERLAP).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from mxattention.kernels import attention_fwd_hopper as hopper
from mxattention.kernels._triton import aggregate
from mxattention.kernels.attention_fwd_fp8 import fp8_finish_lse, fp8_finish_o, fp8_p_tile
from mxattention.kernels.cast import e4m3_round
from mxattention.kernels.launch import launch
from mxattention.kernels.online_softmax import LOG2E
from mxattention.kernels.specs import FwdKernel, FwdSpec, softmax_constexprs

HAS_GLUON = hopper.HAS_GLUON
HEAD_DIM, BLOCK_M, BLOCK_N = hopper.HEAD_DIM, hopper.BLOCK_M, hopper.BLOCK_N
# K^ / V^ ring stages (16 KiB + 16 KiB each: 3 take 112 KiB of shared memory with Q^), registers per
# consumer / producer thread (setmaxnreg). 3 stages with OVERLAP = 2 timed fastest of the variants on
# the H200 (benchmarks/results/fp8_variants_h200_schedules.json, 2026-12-04: kernel alone 1.079x / 1.177x /
# 0.634x cuDNN at 16k / HunyuanVideo 32k / the 512-key cross-attention against 1.063x / 1.106x /
# 0.632x for 2 stages without the overlap).
STAGES, CONSUMER_REGS, PRODUCER_REGS = 3, 240, 24
NUM_WARPS = 4  # the default partition's (consumer 0's) warps
# The schedule within a consumer. 1: S_{j+1} and P~_j V^_j in flight together (the exact Gluon
# forward's schedule); it carries P~ from one iteration to the next, which the compiler does as bytes
# split and packed again: 1161 SASS instructions per key tile and consumer against 908 without (176
# PRMT; carrying P~'s fp32 values instead spills 1736 bytes). 2 (`_ahead8`): S_{j+1} issued before
# S_j's softmax, P~_j V^_j after it, both waited for at the end of the tile: only the fp32 scores
# cross an iteration (912; ptxas issues S_{j+1} once S_j's registers are read, a third into the
# softmax). 3: 2, two tiles per iteration, so S_{j+1} may take other registers than S_j: ptxas
# issues the first tile's S_{j+1} before its exps, but spills. Off: each consumer waits for its wgmmas, the other consumer's run under its softmax.
# Triton 3.6, benchmarks/fp8_gluon_build.py; `VARIANTS` names the schedules fp8_variants.py times.
OVERLAP = 2
# P~'s E4M3 rounding by the hardware conversion (cvt.rn.satfinite.e4m3x2.f32) on targets listed in
# `targets.HW_E4M3_CAST`: exact on P~'s E2M1 x 2**k values, and equal to `cast.e4m3_round` on every
# fp32 in [0, 2**9] (tests/kernels/test_gpu.py), so the bits are those of the software rounding
# (tests/kernels/test_attention_fwd_fp8_gluon.py checks it on the GPU). Unlike the `tl` FP8 kernel
# (`attention_fwd_fp8.HW_P_CAST`) it rounds the [R, BN] fp32 tile, not a 3-D view of bytes.
HW_P_CAST = True
# PNQ's l as each thread's partial sums (its 32 of a row's 128 values per tile, rescaled by alpha per
# row as O~), summed across the 4 lanes of a row once, after the key loop (FlashAttention-3's way), not
# per tile: the same values, summed in another fp32 order. Off: per tile, within each 32-key block
# (8 values per thread, then the 4 lanes by shuffles), then the blocks.
L_PARTIAL = True

# Variants of the kernel as constexpr overrides of the plan's spec (`variant_spec`), timed alone by
# benchmarks/fp8_variants.py: each consumes the same P~ bytes; l and O~ differ by fp32 summation order
# only. SASS per key tile and consumer, BAR.SYNC among
# them (Triton 3.6, sm_90a): 2 stages without the overlap 908 (4), l_per_tile 940
# (the shuffles of l each tile), overlap 1161 (P~'s bytes carried), OVERLAP 2 912 (3 stages: 920, 3),
# joint_empty 904 (2); none spills but qk_ahead2x (935 per tile and 1216 bytes of spill stores).
# JOINT_EMPTY keeps a K^ slot until the tile's P~ V^ is done, so the next K^ lands a tile later.
VARIANTS: dict[str, dict[str, object]] = {
    "default": {},
    "stages2_no_overlap": {"OVERLAP": False, "STAGES": 2},
    "stages2": {"STAGES": 2},
    "l_per_tile": {"L_PARTIAL": False},
    "overlap": {"OVERLAP": True},
    "no_overlap": {"OVERLAP": False},
    "joint_empty": {"JOINT_EMPTY": True},
    "qk_ahead2x": {"OVERLAP": 3},
}


def variant_spec(spec: FwdSpec, name: str) -> FwdSpec:
    """`spec` (`gluon_fp8_fwd_spec`) with the constexprs of schedule variant `name` (`VARIANTS`)."""
    if name not in VARIANTS:
        raise ValueError(f"variant must be one of {sorted(VARIANTS)}, got {name!r}")
    return FwdSpec(spec.kernel, tuple(dict(spec.constexprs, **VARIANTS[name]).items()), spec.num_warps)


# One arrival per slot and consumer (after the tile's P~ V^) on a barrier that is both k_empty and
# v_empty, instead of one on each: Triton's membar puts a warpgroup bar.sync before every mbarrier
# arrive and before the next shared-memory access after one (the arrive counts as writing all of
# shared memory), 4 per key tile, 2 with this. Off by default (to be timed: `VARIANTS`).
JOINT_EMPTY = False

if HAS_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    from mxattention.kernels.attention_fwd_hopper import (
        Epilogue,
        KVRing,
        _cta_barrier,
        _cta_heads,
        _ring_barriers,
        _tile_rows,
        _tma_load,
    )

    _Int = gl.tensor | gl.constexpr

    @aggregate
    class QTile8:
        """One consumer's 64 query rows: Q8 the folded Q^ bytes [B Hq LQP, DQ] (rows from q_row0),
        RowScale their score factors (fp32 [B Hq LQP]: scale log2(e) 2**(a_q + a_k)), q_smem [64, DQ]
        fp8 (the wgmma's A operand), row0 their first row among this head's Lq (O and lse)."""

        Q8: gl.tensor
        RowScale: gl.tensor
        q_smem: gl.shared_memory_descriptor
        q_row0: gl.tensor
        row0: gl.tensor

        def __init__(self, Q8, RowScale, q_smem, q_row0, row0):
            self.Q8 = Q8
            self.RowScale = RowScale
            self.q_smem = q_smem
            self.q_row0 = q_row0
            self.row0 = row0

    @aggregate
    class KeyLoop8:
        """What every key tile reads: Lk keys in n_tiles tiles, ColScale + cs_base the KV head's
        column anchors 2**a_v (fp32 [DV], applied once at the end), CEIL, Q_EXP, Q_MANT (P~'s rule),
        P_CVT (P~'s E4M3 rounding by the hardware conversion), OVERLAP (the schedule), L_PARTIAL (l as
        per-thread partial sums, `L_PARTIAL`), JOINT_EMPTY (one release per slot, `JOINT_EMPTY`): constexprs, each passed and kept on its own (a tuple of
        them built in the kernel holds int32 / int1 scalars, and `P_CVT: gl.constexpr = ...` of such a
        scalar is always true: P_CVT=False skipped the software rounding)."""

        Lk: _Int
        n_tiles: _Int
        ColScale: gl.tensor
        cs_base: gl.tensor
        CEIL: gl.constexpr
        Q_EXP: gl.constexpr
        Q_MANT: gl.constexpr
        P_CVT: gl.constexpr
        OVERLAP: gl.constexpr
        L_PARTIAL: gl.constexpr
        JOINT_EMPTY: gl.constexpr

        def __init__(
            self,
            Lk,
            n_tiles,
            ColScale,
            cs_base,
            CEIL,
            Q_EXP,
            Q_MANT,
            P_CVT,
            OVERLAP,
            L_PARTIAL,
            JOINT_EMPTY,
        ):
            self.Lk = Lk
            self.n_tiles = n_tiles
            self.ColScale = ColScale
            self.cs_base = cs_base
            self.CEIL = gl.constexpr(CEIL)
            self.Q_EXP = gl.constexpr(Q_EXP)
            self.Q_MANT = gl.constexpr(Q_MANT)
            self.P_CVT = gl.constexpr(P_CVT)
            self.OVERLAP = gl.constexpr(OVERLAP)
            self.L_PARTIAL = gl.constexpr(L_PARTIAL)
            self.JOINT_EMPTY = gl.constexpr(JOINT_EMPTY)

    @gluon.jit
    def _q8_to_smem(q):
        """The consumer's folded Q^ bytes into q.q_smem (once)."""
        q_smem = q.q_smem
        R: gl.constexpr = q_smem.type.shape[0]
        DQ: gl.constexpr = q_smem.type.shape[1]
        io: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [gl.num_warps(), 1], [1, 0])
        rows = (q.q_row0 + gl.arange(0, R, layout=gl.SliceLayout(1, io))).to(gl.int64)[:, None]
        cols = gl.arange(0, DQ, layout=gl.SliceLayout(0, io))[None, :]
        q_smem.store(gl.load(q.Q8 + rows * DQ + cols))
        fence_async_shared()
        _cta_barrier()  # every thread's part of Q^ is in shared memory before the wgmmas read it

    @gluon.jit
    def _producer8(k_desc, v_desc, ring, kv_row0, v_row0, n_tiles):
        """TMA K^_j (rows kv_row0 + j BN of the [B Hkv LKP, DQ] bytes) and V^_j (columns j BN of rows
        [v_row0, v_row0 + DV) of the transposed [B Hkv DV, LKP] bytes) into KVRing slot j % STAGES
        once both consumers released it (a fresh barrier passes the parity-1 wait)."""
        BN: gl.constexpr = k_desc.block_type.shape[0]
        STAGES: gl.constexpr = ring.STAGES
        for j in range(n_tiles):
            slot = j % STAGES
            phase = ((j // STAGES) & 1) ^ 1
            mbarrier.wait(ring.k_empty.index(slot), phase)
            mbarrier.expect(ring.k_ready.index(slot), k_desc.block_type.nbytes)
            _tma_load(k_desc, [kv_row0 + j * BN, 0], ring.k_ready.index(slot), ring.k.index(slot))
            mbarrier.wait(ring.v_empty.index(slot), phase)
            mbarrier.expect(ring.v_ready.index(slot), v_desc.block_type.nbytes)
            _tma_load(v_desc, [v_row0, j * BN], ring.v_ready.index(slot), ring.v.index(slot))

    @gluon.jit
    def _qk8(q_smem, ring, slot, zero):
        """Issue S = F_q F_k^T of K^ slot `slot` (async, a fresh accumulator; K^ landed)."""
        return warpgroup_mma(q_smem, ring.k.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)

    @gluon.jit
    def _pv8(p, ring, slot, zero):
        """Issue acc = P~ V^ of V^ slot `slot` (async, a fresh accumulator: Hopper's FP8 wgmma keeps
        fewer bits than fp32 across k-steps, so a tile's products never share O~'s)."""
        return warpgroup_mma(p, ring.v.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)

    @gluon.jit
    def _softmax8(s, m, c, start_n, keys, MASKED: gl.constexpr):
        """(m_new, alpha, P~'s values (fp32, E4M3 values but for P_CVT's rounding) in the 8-bit A
        operand's layout, to be cast by `_e4m3x4`) of folded scores s, with the `tl` FP8 kernel's
        operations (`fp8_p_tile`, its E4M3 rounding); MASKED: keys past Lk get -inf (before the
        factor c, as the `tl` kernel's mask), and the tile's row sums l_tile (PNQ's l)."""
        BN: gl.constexpr = s.shape[1]
        P_CVT: gl.constexpr = keys.P_CVT
        dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s.type.layout, k_width=4)
        if MASKED:
            offs_n = start_n + gl.arange(0, BN, layout=gl.SliceLayout(0, s.type.layout))
            s = gl.where(offs_n[None, :] < keys.Lk, s, float("-inf"))
        m_new, alpha, _p3, r3 = fp8_p_tile(s, m, c, keys.CEIL, keys.Q_EXP, keys.Q_MANT, False)
        # The values in the A operand's layout first (fp32: a renaming of registers, `_key_slots`), then
        # the cast (`_e4m3x4`): P_CVT rounds by the hardware conversion (exact on P~'s E2M1 x 2**k
        # values, the nearest E4M3 below 2**-16 as `cast.e4m3_round`), else the values are E4M3
        # already (`cast.e4m3_round`) and the conversion is exact.
        if not P_CVT:
            r3 = e4m3_round(r3)
        # PNQ's l in fp32 from the values the bytes hold: r3 itself, an E4M3 value under the block
        # scale floor of `fp8_p_tile` (the FP8 accumulator's sums of P~ x ones moved the weights' row
        # sums off 1 by up to 3.6e-3; l from r3 before that floor, by up to n 2**-18 for n keys).
        l_tile = _l_sums(r3, keys.L_PARTIAL)
        return m_new, alpha, gl.convert_layout(_key_slots(r3), dot_a), l_tile

    @gluon.jit
    def _release_k(ring, slot, keys):
        """This consumer is done with K^ slot `slot`: an arrival on k_empty, unless JOINT_EMPTY (then
        v_empty is k_empty and the slot is released once, with V^, after the tile's P~ V^)."""
        if not keys.JOINT_EMPTY:
            mbarrier.arrive(ring.k_empty.index(slot))

    @gluon.jit
    def _l_sums(r3, L_PARTIAL: gl.constexpr):
        """A tile's row sums of r3 [R, BN / 32, 32] (in the accumulator's layout): L_PARTIAL each
        thread's own, [R, 4] (lane t of a row's quad holds keys 8 i + 2 t + e of every block), else the
        rows' [R] (within each block, then the blocks: m's layout)."""
        if L_PARTIAL:
            R: gl.constexpr = r3.shape[0]
            NB: gl.constexpr = r3.shape[1]
            return gl.sum(gl.sum(gl.sum(gl.reshape(r3, [R, NB, 4, 4, 2]), 4), 2), 1)
        else:
            return gl.sum(gl.sum(r3, 2), 1)

    @gluon.jit
    def _l_fma(l, alpha, l_tile, L_PARTIAL: gl.constexpr):
        """l alpha + l_tile per row (alpha [R] in m's layout; l, l_tile as `_l_sums` gives them)."""
        if L_PARTIAL:
            return gl.fma(l, gl.convert_layout(alpha, gl.SliceLayout(1, l.type.layout))[:, None], l_tile)
        else:
            return gl.fma(l, alpha, l_tile)

    @gluon.jit
    def _e4m3x4(x):
        """float8e4nv of fp32 x, round to nearest even, saturating (E4M3 has no infinity): two
        cvt.rn.satfinite.e4m3x2.f32 per 4 neighbouring registers, written as one 32-bit register,
        which in the 8-bit A operand's layout (k_width 4) is the operand's register as it is (the
        cast's generic lowering splits each pair into bytes and packs them again: ~200 more
        instructions per key tile)."""
        return gl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; "
            "cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; mov.b32 $0, {lo, hi}; }",
            "=r,f,f,f,f",
            [x],
            dtype=gl.float8e4nv,
            is_pure=True,
            pack=4,
        )

    @gluon.jit
    def _key_slots(x3):
        """x3 [R, BN / 32, 32] (a tile's values in the wgmma accumulator's layout) as [R, BN] with each
        32-key block's columns in `attention_fwd_fp8.key_slot` order: column 16 i1 + 8 i0 + 2 t + e
        goes to 16 i1 + 4 t + 2 i0 + e, which puts every thread's values where the 8-bit A operand
        (k_width 4) wants them, so the conversion to it moves no value between lanes."""
        R: gl.constexpr = x3.shape[0]
        NB: gl.constexpr = x3.shape[1]
        x6 = gl.reshape(x3, [R, NB, 2, 2, 4, 2])  # (row, block, i1, i0, t, e)
        return gl.reshape(gl.permute(x6, (0, 1, 2, 4, 3, 5)), [R, NB * 32])

    @gluon.jit
    def _rows_of(x, layout: gl.constexpr):
        return gl.convert_layout(x, gl.SliceLayout(1, layout))[:, None]

    @gluon.jit
    def _tile8(j, m, l, o, c, q, ring, zero, keys, MASKED: gl.constexpr):
        """Key tile j without the overlap: S_j, its softmax, then P~_j V^_j and its row sums, O~ =
        fma(O~, alpha_j, P~_j V^_j), l likewise; (m, l, O~) after it. P~ lives within the tile, so
        its bytes go to the wgmma in the registers the cast wrote (carried across iterations, the
        compiler splits them into bytes and packs them again)."""
        BN: gl.constexpr = ring.k.type.shape[1]
        STAGES: gl.constexpr = ring.STAGES
        mma: gl.constexpr = o.type.layout
        slot = j % STAGES
        phase = (j // STAGES) & 1
        mbarrier.wait(ring.k_ready.index(slot), phase)
        s = _qk8(q.q_smem, ring, slot, zero)
        s, _k_done = warpgroup_mma_wait(0, deps=[s, ring.k.index(slot)])
        _release_k(ring, slot, keys)
        m, alpha, p, l_tile = _softmax8(s, m, c, j * BN, keys, MASKED)
        p = _e4m3x4(p)
        mbarrier.wait(ring.v_ready.index(slot), phase)
        acc = _pv8(p, ring, slot, zero)
        acc, _v_done = warpgroup_mma_wait(0, deps=[acc, ring.v.index(slot)])
        mbarrier.arrive(ring.v_empty.index(slot))
        o = gl.fma(o, _rows_of(alpha, mma), acc)
        l = _l_fma(l, alpha, l_tile, keys.L_PARTIAL)
        return m, l, o

    @gluon.jit
    def _ahead8(j, s, m, l, o, c, q, ring, zero, keys):
        """Key tile j < n_tiles - 1 (all its keys valid) of OVERLAP == 2, S_j done (s): S_{j+1} issued
        first, in flight under S_j's softmax, then P~_j V^_j; both waited for, O~ = fma(O~, alpha_j,
        P~_j V^_j), l likewise; (m, l, O~, S_{j+1}). P~_j never crosses an iteration (S_{j+1} does, as
        the fp32 accumulator it is)."""
        BN: gl.constexpr = ring.k.type.shape[1]
        STAGES: gl.constexpr = ring.STAGES
        mma: gl.constexpr = o.type.layout
        slot = j % STAGES
        nxt = (j + 1) % STAGES
        mbarrier.wait(ring.k_ready.index(nxt), ((j + 1) // STAGES) & 1)
        s_next = _qk8(q.q_smem, ring, nxt, zero)
        m, alpha, p, l_tile = _softmax8(s, m, c, j * BN, keys, False)
        p = _e4m3x4(p)
        mbarrier.wait(ring.v_ready.index(slot), (j // STAGES) & 1)
        acc = _pv8(p, ring, slot, zero)
        s_next, acc, _k_done, _v_done = warpgroup_mma_wait(
            0, deps=[s_next, acc, ring.k.index(nxt), ring.v.index(slot)]
        )
        _release_k(ring, nxt, keys)
        mbarrier.arrive(ring.v_empty.index(slot))
        o = gl.fma(o, _rows_of(alpha, mma), acc)
        l = _l_fma(l, alpha, l_tile, keys.L_PARTIAL)
        return m, l, o, s_next

    @gluon.jit
    def _step8(j, m, l, o, alpha_prev, p, l_prev, c, q, ring, zero, keys, MASKED: gl.constexpr):
        """Key tile j >= 1: (m, l, O~ after tile j - 1, alpha_j, P~_j, its row sums): O~ =
        fma(O~, alpha_{j-1}, P~_{j-1} V^_{j-1}), l = fma(l, alpha_{j-1}, l_{j-1}). OVERLAP: S_j and those
        products in flight together, the softmax of S_j under the latter; else the products, then S_j
        and its softmax (the other consumer's wgmmas fill the gaps)."""
        BN: gl.constexpr = ring.k.type.shape[1]
        STAGES: gl.constexpr = ring.STAGES
        mma: gl.constexpr = o.type.layout
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(ring.k_ready.index(slot), (j // STAGES) & 1)
        mbarrier.wait(ring.v_ready.index(prev), ((j - 1) // STAGES) & 1)
        if keys.OVERLAP:
            s = _qk8(q.q_smem, ring, slot, zero)
            acc = _pv8(p, ring, prev, zero)
            s, _k_done = warpgroup_mma_wait(1, deps=[s, ring.k.index(slot)])
            _release_k(ring, slot, keys)
            m, alpha, p_next, l_next = _softmax8(s, m, c, j * BN, keys, MASKED)
            p_next = _e4m3x4(p_next)
            # The wait behind an always-true branch (tile j holds keys), as `attention_fwd_hopper`'s
            # step: else ptxas hoists it above the softmax's last exps.
            if j * BN < keys.Lk:
                done, _v_done = warpgroup_mma_wait(0, deps=[acc, ring.v.index(prev)])
            else:
                _cta_barrier()
                done, _v_done = warpgroup_mma_wait(0, deps=[acc, ring.v.index(prev)])
            mbarrier.arrive(ring.v_empty.index(prev))
            o = gl.fma(o, _rows_of(alpha_prev, mma), done)
            l = _l_fma(l, alpha_prev, l_prev, keys.L_PARTIAL)
        else:
            acc = _pv8(p, ring, prev, zero)
            acc, _v_done = warpgroup_mma_wait(0, deps=[acc, ring.v.index(prev)])
            mbarrier.arrive(ring.v_empty.index(prev))
            o = gl.fma(o, _rows_of(alpha_prev, mma), acc)
            l = _l_fma(l, alpha_prev, l_prev, keys.L_PARTIAL)
            s = _qk8(q.q_smem, ring, slot, zero)
            s, _k_done = warpgroup_mma_wait(0, deps=[s, ring.k.index(slot)])
            _release_k(ring, slot, keys)
            m, alpha, p_next, l_next = _softmax8(s, m, c, j * BN, keys, MASKED)
            p_next = _e4m3x4(p_next)
        return m, l, o, alpha, p_next, l_next

    @gluon.jit
    def _consumer8(q, ring, keys, epi):
        """Rows [row0, row0 + 64) of this CTA's query tile (QTile8 q): the key loop over the KVRing
        ring (KeyLoop8 keys) and the epilogue (Epilogue epi: O by gl.store)."""
        q_smem = q.q_smem
        R: gl.constexpr = q_smem.type.shape[0]
        BN: gl.constexpr = ring.k.type.shape[1]
        DV: gl.constexpr = ring.v.type.shape[1]
        STAGES: gl.constexpr = ring.STAGES
        mma: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 32]
        )
        _q8_to_smem(q)
        zero = gl.zeros([R, BN], gl.float32, mma)
        o = gl.zeros([R, DV], gl.float32, mma)
        # m, l and c in the layout the block-max reduction gives (that of the `tl` kernel's m).
        m = gl.max(
            gl.max(gl.reshape(gl.full([R, BN], float("-inf"), gl.float32, mma), [R, BN // 32, 32]), 2), 1
        )
        # folded row sums (`_l_sums`' layout)
        l = _l_sums(gl.reshape(gl.zeros([R, BN], gl.float32, mma), [R, BN // 32, 32]), keys.L_PARTIAL)
        c = gl.load(q.RowScale + q.q_row0 + gl.arange(0, R, layout=m.type.layout))
        n_tiles = keys.n_tiles
        n_full = keys.Lk // BN  # tiles whose keys are all valid: no select on their scores
        if keys.OVERLAP >= 2:
            mbarrier.wait(ring.k_ready.index(0), 0)
            s = _qk8(q_smem, ring, 0, zero)
            s, _k_done = warpgroup_mma_wait(0, deps=[s, ring.k.index(0)])
            _release_k(ring, 0, keys)
            if keys.OVERLAP == 3:
                # Two tiles per iteration: S_{j+1} need not take S_j's registers (the loop's
                # back edge ties S_{j+2} to them), so ptxas may issue it before S_j's softmax.
                n_pairs = (n_tiles - 1) // 2
                for i in range(0, n_pairs):
                    m, l, o, s = _ahead8(2 * i, s, m, l, o, c, q, ring, zero, keys)
                    m, l, o, s = _ahead8(2 * i + 1, s, m, l, o, c, q, ring, zero, keys)
                for j in range(2 * n_pairs, n_tiles - 1):
                    m, l, o, s = _ahead8(j, s, m, l, o, c, q, ring, zero, keys)
            else:
                for j in range(0, n_tiles - 1):  # n_tiles - 1 <= n_full: no key past Lk
                    m, l, o, s = _ahead8(j, s, m, l, o, c, q, ring, zero, keys)
            # The last tile, masked whether or not it is full (a full tile's scores pass unchanged).
            last = n_tiles - 1
            m, alpha, p, l_tile = _softmax8(s, m, c, last * BN, keys, True)
            p = _e4m3x4(p)
            mbarrier.wait(ring.v_ready.index(last % STAGES), (last // STAGES) & 1)
            acc = _pv8(p, ring, last % STAGES, zero)
            acc, _v_done = warpgroup_mma_wait(0, deps=[acc, ring.v.index(last % STAGES)])
            mbarrier.arrive(ring.v_empty.index(last % STAGES))
            o = gl.fma(o, _rows_of(alpha, mma), acc)
            l = _l_fma(l, alpha, l_tile, keys.L_PARTIAL)
        elif keys.OVERLAP:
            mbarrier.wait(ring.k_ready.index(0), 0)
            s = _qk8(q_smem, ring, 0, zero)
            s, _k_done = warpgroup_mma_wait(0, deps=[s, ring.k.index(0)])
            _release_k(ring, 0, keys)
            m, alpha, p, lp = _softmax8(s, m, c, 0, keys, True)
            p = _e4m3x4(p)
            for j in range(1, n_full):
                m, l, o, alpha, p, lp = _step8(j, m, l, o, alpha, p, lp, c, q, ring, zero, keys, False)
            for j in range(gl.maximum(n_full, 1), n_tiles):
                m, l, o, alpha, p, lp = _step8(j, m, l, o, alpha, p, lp, c, q, ring, zero, keys, True)
            last = (n_tiles - 1) % STAGES
            mbarrier.wait(ring.v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
            acc = _pv8(p, ring, last, zero)
            acc, _v_done = warpgroup_mma_wait(0, deps=[acc, ring.v.index(last)])
            mbarrier.arrive(ring.v_empty.index(last))
            o = gl.fma(o, _rows_of(alpha, mma), acc)
            l = _l_fma(l, alpha, lp, keys.L_PARTIAL)
        else:
            for j in range(0, n_full):
                m, l, o = _tile8(j, m, l, o, c, q, ring, zero, keys, False)
            for j in range(n_full, n_tiles):
                m, l, o = _tile8(j, m, l, o, c, q, ring, zero, keys, True)

        # O and lse in the layout of O~'s rows (the `tl` FP8 kernel's finish).
        if keys.L_PARTIAL:
            l = gl.sum(l, 1)  # the 4 lanes' partial sums of each row, once
        l_rows = gl.convert_layout(l, gl.SliceLayout(1, mma))
        m_rows = gl.convert_layout(m, gl.SliceLayout(1, mma))
        cols = gl.arange(0, DV, layout=gl.SliceLayout(0, mma))
        colscale = gl.load(keys.ColScale + keys.cs_base + cols)  # 2**a_v per output column
        out = fp8_finish_o(o, l_rows, colscale, epi.OUT_MAX)
        lse = fp8_finish_lse(l_rows, m_rows)
        rows = q.row0 + gl.arange(0, R, layout=gl.SliceLayout(1, mma))
        optr = (
            epi.Out
            + epi.out_base
            + rows[:, None].to(gl.int64) * epi.stride_om
            + cols[None, :] * epi.stride_od
        )
        gl.store(optr, out.to(epi.Out.dtype.element_ty), mask=(rows[:, None] < epi.Lq) & (cols[None, :] < DV))
        gl.store(epi.Lse + epi.lse_base + rows, lse, mask=rows < epi.Lq)

    @gluon.jit
    def _fast_fwd_hopper_kernel(
        Q8,
        RowScale,
        k_desc,
        v_desc,
        ColScale,
        Out,
        Lse,
        Lq,
        Lk,
        H,
        GROUP,
        LQP,
        LKP,
        stride_ob,
        stride_oh,
        stride_om,
        stride_od,
        DQ: gl.constexpr,
        PNQ: gl.constexpr,
        CEIL: gl.constexpr,
        Q_EXP: gl.constexpr,
        Q_MANT: gl.constexpr,
        P_CVT: gl.constexpr,
        OUT_MAX: gl.constexpr,
        STAGES: gl.constexpr,
        CONSUMER_REGS: gl.constexpr,
        PRODUCER_REGS: gl.constexpr,
        OVERLAP: gl.constexpr,
        L_PARTIAL: gl.constexpr = L_PARTIAL,
        JOINT_EMPTY: gl.constexpr = JOINT_EMPTY,
    ):
        BN: gl.constexpr = k_desc.block_type.shape[0]
        DV: gl.constexpr = v_desc.block_type.shape[0]
        R: gl.constexpr = 64
        pid_m, b, h, bh, bhk = _cta_heads(H, GROUP)
        q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([R, DQ], gl.float8e4nv)
        q0 = gl.allocate_shared_memory(gl.float8e4nv, [R, DQ], q_layout)
        q1 = gl.allocate_shared_memory(gl.float8e4nv, [R, DQ], q_layout)
        k_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, BN, DQ], k_desc.layout)
        v_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, DV, BN], v_desc.layout)
        k_ready, v_ready, k_empty, v_empty = _ring_barriers(STAGES, 1)
        n_tiles, row0, q_row0, out_base, lse_base = _tile_rows(
            pid_m, LQP, Lk, Lq, b, h, bh, stride_ob, stride_oh, R, BN
        )
        if JOINT_EMPTY:  # the producer's second wait (v_empty) finds the phase its first waited for
            ring = KVRing(k_smem, v_smem, k_smem, k_ready, v_ready, k_empty, k_empty, False)
        else:
            ring = KVRing(k_smem, v_smem, k_smem, k_ready, v_ready, k_empty, v_empty, False)
        cs_base = bhk.to(gl.int64) * DV
        keys = KeyLoop8(
            Lk,
            n_tiles,
            ColScale,
            cs_base,
            CEIL,
            Q_EXP,
            Q_MANT,
            P_CVT,
            OVERLAP,
            L_PARTIAL,
            JOINT_EMPTY,
        )
        epi = Epilogue(Out, Lse, None, b, h, out_base, lse_base, stride_om, stride_od, Lq, OUT_MAX, False)
        gl.warp_specialize(
            [
                (_consumer8, (QTile8(Q8, RowScale, q0, q_row0, row0), ring, keys, epi)),
                (_consumer8, (QTile8(Q8, RowScale, q1, q_row0 + R, row0 + R), ring, keys, epi)),
                (_producer8, (k_desc, v_desc, ring, bhk * LKP, bhk * DV, n_tiles)),
            ],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )  # fmt: skip


def fast_gluon_reason(
    *, dq: int, dv: int, block_n: int, is_causal: bool = False, masked: bool = False, debug_p: bool = False,
    scale: float = 1.0, pnq: bool = True,
) -> str | None:  # fmt: skip
    """None if `mx_attention_fwd_hopper_fp8` computes this fast-mode call (dense: varlen and Q
    smoothing have no fast kernel at all, `attention_fwd_fp8.fp8_reason`), else why not (the `tl`
    FP8 kernel serves it)."""
    if not HAS_GLUON:
        return "this Triton has no Gluon Hopper layer (triton.experimental.gluon)"
    if (dq, dv) != (HEAD_DIM, HEAD_DIM):
        return f"head dims ({dq}, {dv}): the Gluon FP8 kernel is built for {HEAD_DIM}"
    if block_n != BLOCK_N:
        return f"block_n={block_n}: the Gluon FP8 kernel takes {BLOCK_N} keys per tile"
    named = [k for k, v in dict(is_causal=is_causal, mask=masked, debug_p=debug_p).items() if v]
    if named:
        return f"{', '.join(named)}: the Gluon FP8 kernel serves dense unmasked calls only"
    if not (scale > 0 and math.isfinite(scale * LOG2E)):
        return f"scale={scale!r}: the kernels' constant scale * log2(e) must be a positive fp32"
    if not pnq:
        return "PNQ off: the Gluon FP8 kernel's row sum is PNQ's (the MMA's sum of the folded P~)"
    return None


@dataclass(frozen=True)
class FastGluonCall:
    """One launch of the Gluon FP8 kernel: grid, positional arguments, its spec."""

    grid: tuple[int, int]
    args: tuple
    spec: FwdSpec


def _desc(x2: torch.Tensor, box: list[int]) -> TensorDescriptor:
    """A TMA descriptor over a 2-D view of one-byte values with boxes `box`."""
    layout = hopper._shared_layout(tuple(box), gl.float8e4nv)
    return TensorDescriptor(x2, list(x2.shape), list(x2.stride()), box, layout)


def fast_gluon_launch(
    spec: FwdSpec,
    q8: torch.Tensor,
    rowscale: torch.Tensor,
    k8: torch.Tensor,
    v8t: torch.Tensor,
    colscale: torch.Tensor,
    *,
    lq: int,
    lk: int,
    group: int,
    out: torch.Tensor,
    lse: torch.Tensor | None = None,
) -> tuple[torch.Tensor, FastGluonCall]:
    """(lse [B, Hq, Lq] fp32, the launch) of `spec` (`gluon_fp8_fwd_spec`) on
    `attention_fwd_fp8.fp8_operands`' tensors: q8 [B, Hq, LQP, 128], k8 [B, Hkv, LKP, 128], v8t
    [B, Hkv, 128, LKP] (float8_e4m3fn, contiguous), rowscale fp32 [B, Hq, LQP], colscale fp32
    [B, Hkv, 128]; out [B, Hq, Lq, 128] (any strides)."""
    bsz, hq, lqp, dq = q8.shape
    hk, lkp = k8.shape[1], k8.shape[2]
    f8 = torch.float8_e4m3fn
    if (
        lqp % BLOCK_M
        or lkp % BLOCK_N
        or dq != HEAD_DIM
        or tuple(k8.shape) != (bsz, hk, lkp, HEAD_DIM)
        or tuple(v8t.shape) != (bsz, hk, HEAD_DIM, lkp)
        or any(x.dtype != f8 or not x.is_contiguous() for x in (q8, k8, v8t))
    ):
        raise ValueError(
            f"q8 [B, Hq, LQP % {BLOCK_M} == 0, {HEAD_DIM}], k8 [B, Hkv, LKP % {BLOCK_N} == 0, {HEAD_DIM}] and "
            f"v8t [B, Hkv, {HEAD_DIM}, LKP], contiguous float8_e4m3fn, expected; got {tuple(q8.shape)} "
            f"{q8.dtype}, {tuple(k8.shape)} {k8.dtype}, {tuple(v8t.shape)} {v8t.dtype}"
        )
    if hq != hk * group or out.shape != (bsz, hq, lq, HEAD_DIM):
        raise ValueError(
            f"heads {hq} = {hk} x group {group} and out [B, Hq, Lq, 128] expected, got {tuple(out.shape)}"
        )
    if bsz * hk * lkp >= 2**31 or lk < 1:
        raise ValueError(
            f"K^ rows B x Hkv x LKP = {bsz * hk * lkp} must be in [1, 2**31) (TMA's int32 row coordinate)"
        )
    if lse is None:
        lse = torch.empty((bsz, hq, lq), dtype=torch.float32, device=q8.device)
    k_desc = _desc(k8.view(bsz * hk * lkp, HEAD_DIM), [BLOCK_N, HEAD_DIM])
    v_desc = _desc(v8t.view(bsz * hk * HEAD_DIM, lkp), [HEAD_DIM, BLOCK_N])
    args = (q8, rowscale, k_desc, v_desc, colscale, out, lse, lq, lk, hq, group, lqp, lkp, *out.stride())
    return lse, FastGluonCall((lqp // BLOCK_M, bsz * hq), args, spec)


def mx_attention_fwd_hopper_fp8(*operands: torch.Tensor, spec: FwdSpec, slot=None, **kwargs) -> torch.Tensor:
    """Run the Gluon FP8 kernel on `fp8_operands` (q8, rowscale, k8, v8t, colscale) with the keywords
    of `fast_gluon_launch` (`slot`: its slot in a cached plan, `launch.launch`); writes `out`,
    returns lse [B, Hq, Lq]."""
    lse, call = fast_gluon_launch(spec, *operands, **kwargs)
    launch(_fast_fwd_hopper_kernel, call.grid, call.args, spec.launch_kwargs, slot)
    return lse


def gluon_fp8_fwd_spec(
    *, p_rule: tuple[bool, int, int], pnq: bool, out_dtype: torch.dtype, p_cvt: bool = False
) -> FwdSpec:
    """The `attention_fwd_hopper_fp8` launch of a fast-mode call (P~'s hardware E4M3 rounding
    `p_cvt`); the ring's STAGES, the partitions' registers and the schedule are the module's."""
    constexprs = dict(
        DQ=HEAD_DIM,
        **softmax_constexprs(p_rule, pnq, out_dtype),
        P_CVT=bool(p_cvt),
        STAGES=STAGES,
        CONSUMER_REGS=CONSUMER_REGS,
        PRODUCER_REGS=PRODUCER_REGS,
        OVERLAP=OVERLAP,
        L_PARTIAL=L_PARTIAL,
        JOINT_EMPTY=JOINT_EMPTY,
    )
    return FwdSpec(FwdKernel.GLUON, tuple(constexprs.items()), NUM_WARPS)
