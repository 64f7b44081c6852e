"""The attention forward on Hopper (sm_90a) as a warp-specialized Gluon kernel, FlashAttention-3's scheme.

Exposes `HAS_GLUON`, `gluon_fwd_reason` (why a call cannot take this kernel, None if it can),
`gluon_fwd_call` (the launch, as data: `codegen` builds it offline) and `mx_attention_fwd_hopper`
(run it: writes O, returns lse).

It computes exactly what `attention_fwd._mx_attention_fwd_kernel` computes for the case that
matters for speed (docs/design.md, 'Kernel plan'): bf16 K^ / V^ (the "bf16" matrix path), head dims
DQ = DV = 128, BN = 128 keys per tile, no causal mask, no user mask, not varlen, no debug_p; any P~
ladder and rule, PNQ on or off, Q smoothing or not, any lengths, GQA. Same operations in the same
order, so the results are the `tl` kernel's bit for bit (tests/kernels/test_attention_fwd_hopper.py
on the H200): S = Q^ K^_j^T by bf16 wgmma m64n128k16 over the same head-dim order (fp32
accumulation; with Q smoothing started from the correction row qm K^_j^T, the accumulator Triton
makes of the `tl` kernel's `s + corr`), the block maxima, row max, alpha, P~ roundings (`cast.block_scale`,
`cast.elem_round`), the row sum in the `tl` kernel's layouts (the same in-thread order and lane
shuffles), O~ = alpha O~ + P^ V^_j, then O = O~ / l, lse.

Structure (one CTA per 128 query rows of one (batch, head)):

- a producer partition (1 warp, few registers) brings K^_j and V^_j by TMA into a ring of STAGES
  shared-memory buffers, each guarded by a `ready` (TMA bytes landed) and an `empty` (both
  consumers done) mbarrier; with Q smoothing the tile's correction row (512 bytes, one per CTA:
  its 128 rows lie in one smoothing block) rides with K^_j on the same `ready` barrier;
- two consumer partitions (4 warps = one warpgroup each) own 64 query rows each, with their own
  Q^ (decoded once into shared memory) and (m, l, O~) in registers. They share the K^ / V^ tiles
  but not the time: each runs its own softmax while the other's wgmmas use the tensor cores.
- intra-warpgroup pipelining: S_{j+1} = Q^ K^_{j+1}^T and P^_j V^_j are both in flight while the
  softmax of tile j + 1 runs; the rescale of O~ by alpha waits for P^_j V^_j, so O~ sees the same
  sequence of operations as in the `tl` kernel.

That is the only schedule it has: the variants measured against it (no overlap, the consumers'
ping-pong, 3 ring stages, Q smoothing's correction row loaded by the consumers instead of made by
the producer; benchmarks/NOTES.md v12a, v13-corr) were no faster and left the kernel (git show
ba53bdc:src/mxattention/kernels/attention_fwd_hopper.py has them).

The kernel builds its device-side parameters once and hands them to the partitions as aggregates
(FlashAttention-3's mainloop / epilogue params): `KVRing` (the shared-memory ring and its
barriers), `QTile` (one consumer's rows of Q^), `KeyLoop` (what each tile's softmax reads),
`Epilogue` (where O and lse go). The P~ step and the finish are `online_softmax`'s, the `tl`
kernel's own functions.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch

from mxattention.kernels import targets
from mxattention.kernels._triton import aggregate
from mxattention.kernels.launch import launch
from mxattention.kernels.online_softmax import LOG2E, finish_lse, finish_o, p_tile
from mxattention.kernels.rules import KERNEL_ELEMS
from mxattention.kernels.specs import FwdKernel, FwdSpec, softmax_constexprs
from mxattention.kernels.targets import Target, current_target, hw_e4m3_cast

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language._core import _unwrap_if_constexpr, builtin
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        tma,
        warpgroup_mma,
        warpgroup_mma_wait,
    )
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # Renamed after Triton 3.6 (CI runs 3.9); same arguments.
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    HAS_GLUON = True
except (ImportError, AttributeError):  # no Triton, or one without Gluon's Hopper layer
    HAS_GLUON = False

FWD_KERNELS = ("gluon", "tl")
HEAD_DIM = 128  # DQ = DV
BLOCK_M = 128  # query rows per CTA: two consumers of 64
BLOCK_N = 128  # keys per tile (cfg.block_n must be this)
# K^ / V^ ring stages, registers per consumer / producer thread (setmaxnreg).
STAGES, CONSUMER_REGS, PRODUCER_REGS = 2, 240, 24
NUM_WARPS = 4  # the default partition's (consumer 0's) warps
# The producer that writes the correction's parts holds the next tile's keys too (`_corr_row`): 24
# registers spill there with Triton 3.9; 4 warps x 32 more fit beside two 240-register consumers.
PRODUCER_REGS_CORR = 32
# O leaves through shared memory by one TMA store per consumer where out's strides allow a
# descriptor and its dtype is 2 bytes (the tile then fits in the consumer's Q^ buffer; docs/design.md,
# 'O by TMA store').
OUT_TMA = True


if HAS_GLUON:
    # A scalar kernel argument: Triton passes an integer equal to 1 as a constexpr.
    _Int = gl.tensor | gl.constexpr
    # The fields' order is the order in which a worker partition receives its values, which ptxas's
    # schedule follows: it keeps that of the ungrouped arguments (same SASS, benchmarks/sass_fingerprint.py).

    @aggregate
    class KVRing:
        """The CTA's K^ / V^ ring, shared by the producer and both consumers: STAGES slots of K^_j
        (k [STAGES, BN, DQ]) and V^_j (v [STAGES, BN, DV]), bf16; Q smoothing's correction slots c
        (SMOOTH: the row's bf16 parts [STAGES, 16, BN], `_corr_parts`; else c is k and never read);
        per slot the mbarriers k_ready / v_ready (TMA bytes landed; k_ready also the producer's parts
        with SMOOTH) and k_empty / v_empty (both consumers done)."""

        k: gl.shared_memory_descriptor
        v: gl.shared_memory_descriptor
        c: gl.shared_memory_descriptor
        k_ready: gl.shared_memory_descriptor
        v_ready: gl.shared_memory_descriptor
        k_empty: gl.shared_memory_descriptor
        v_empty: gl.shared_memory_descriptor
        STAGES: gl.constexpr
        SMOOTH: gl.constexpr

        def __init__(self, k, v, c, k_ready, v_ready, k_empty, v_empty, SMOOTH):
            self.k = k
            self.v = v
            self.c = c
            self.k_ready = k_ready
            self.v_ready = v_ready
            self.k_empty = k_empty
            self.v_empty = v_empty
            self.STAGES = gl.constexpr(k.type.shape[0])
            self.SMOOTH = gl.constexpr(SMOOTH)

    @aggregate
    class QTile:
        """One consumer's 64 query rows: their Q^ codes Qc and E8M0 bytes Qs (the pre-pass's
        [B Hq LQP, ...] rows, from row q_row0), row0 their first row among this head's Lq (O and lse),
        q_smem [64, DQ] their bf16 Q^ (decoded once; O's staging tile at the end), QK_ELEM the
        ladder of Q^'s codes."""

        Qc: gl.tensor
        Qs: gl.tensor
        q_smem: gl.shared_memory_descriptor
        q_row0: gl.tensor
        row0: gl.tensor
        QK_ELEM: gl.constexpr

        def __init__(self, Qc, Qs, q_smem, q_row0, row0, QK_ELEM):
            self.Qc = Qc
            self.Qs = Qs
            self.q_smem = q_smem
            self.q_row0 = q_row0
            self.row0 = row0
            self.QK_ELEM = gl.constexpr(QK_ELEM)

    @aggregate
    class KeyLoop:
        """What every key tile's softmax reads: qk_scale (scale * log2 e, fp32), Lk keys in n_tiles
        tiles, CAST = (PNQ, CEIL, Q_EXP, Q_MANT, P_ELEM, P_CVT, EXP_FLUSH) (constexprs: P~'s ladder
        and rule, `online_softmax.p_tile`; PNQ: l sums Q(P~))."""

        Lk: _Int
        n_tiles: _Int
        qk_scale: gl.tensor
        CAST: gl.tuple

        def __init__(self, qk_scale, Lk, n_tiles, CAST):
            self.qk_scale = qk_scale
            self.Lk = Lk
            self.n_tiles = n_tiles
            self.CAST = CAST

    @aggregate
    class Epilogue:
        """Where O and lse go: Out [B, Hq, Lq, DV] at out_base (this (b, h)) with row / column
        strides stride_om / stride_od, or through o_desc (a [B, Hq, Lq, DV] TMA descriptor over out's
        strides, O_TMA; rows past Lq clipped); Lse [B Hq, Lq] at lse_base. OUT_MAX > 0: O saturated
        there (`online_softmax.finish_o`)."""

        Out: gl.tensor
        Lse: gl.tensor
        Lq: _Int
        out_base: gl.tensor
        lse_base: gl.tensor
        stride_om: _Int
        stride_od: _Int
        o_desc: tma.tensor_descriptor | gl.constexpr
        b: gl.tensor
        h: gl.tensor
        OUT_MAX: gl.constexpr
        O_TMA: gl.constexpr

        def __init__(
            self, Out, Lse, o_desc, b, h, out_base, lse_base, stride_om, stride_od, Lq, OUT_MAX, O_TMA
        ):
            self.Out = Out
            self.Lse = Lse
            self.o_desc = o_desc
            self.b = b
            self.h = h
            self.out_base = out_base
            self.lse_base = lse_base
            self.stride_om = stride_om
            self.stride_od = stride_od
            self.Lq = Lq
            self.OUT_MAX = gl.constexpr(OUT_MAX)
            self.O_TMA = gl.constexpr(O_TMA)

    @builtin
    def _smem_as(buf, dtype, shape, layout, _semantic=None):
        """buf viewed with another dtype, shape and layout: Gluon's `reinterpret` (`_reinterpret`
        in Triton 3.6), callable under either name."""
        shape = [_unwrap_if_constexpr(s) for s in shape]
        return _semantic.memdesc_reinterpret(
            buf, _unwrap_if_constexpr(dtype), shape, _unwrap_if_constexpr(layout)
        )

    @gluon.jit
    def _q_hat_to_smem(q):
        """Decode the consumer's Q^ rows (QTile q: codes and E8M0 bytes of the pre-pass) to bf16 into
        q.q_smem, value for value `cast.dequant_mx` (exact: codes x 2**e fit bf16; E4M3 below 2**-124
        rounds as there)."""
        q_smem = q.q_smem
        R: gl.constexpr = q_smem.type.shape[0]
        DQ: gl.constexpr = q_smem.type.shape[1]
        io: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [gl.num_warps(), 1], [1, 0])
        rows = (q.q_row0 + gl.arange(0, R, layout=gl.SliceLayout(1, io))).to(gl.int64)[:, None]
        cols = gl.arange(0, DQ, layout=gl.SliceLayout(0, io))[None, :]
        scale = gl.load(q.Qs + rows * (DQ // 32) + cols // 32).to(gl.int32)
        if q.QK_ELEM == "e4m3":
            c = gl.load(q.Qc + rows * DQ + cols).to(gl.int32)
            v = (((c & 127) << 20) | ((c & 128) << 24)).to(gl.float32, bitcast=True)
            GAP: gl.constexpr = 120
        else:
            c = (gl.load(q.Qc + rows * (DQ // 2) + cols // 2).to(gl.int32) >> ((cols & 1) * 4)) & 15
            h = ((c & 7) << 9) | ((c & 8) << 12)
            v = h.to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
            GAP: gl.constexpr = 14
        # cast._times_scales: the factor 2**(e + GAP) in two powers of two, byte 255 -> NaN.
        e = scale - 127
        f = _exp2_int(gl.minimum(e + GAP, 127))
        g = gl.where(scale == 255, float("nan"), _exp2_int(gl.maximum(e + GAP - 127, 0)))
        q_smem.store((v * f * g).to(gl.bfloat16))
        fence_async_shared()
        _cta_barrier()  # every thread's part of Q^ is in shared memory before the wgmmas read it

    @gluon.jit
    def _exp2_int(e):
        """`cast.exp2_int`: 2**e in fp32 for int32 e in [-127, 127]."""
        return gl.where(e >= -126, (e + 127) << 23, 0x400000).to(gl.float32, bitcast=True)

    @gluon.jit
    def _producer(k_desc, v_desc, c_desc, ring, kv_row0, c_row, LKP, n_tiles):
        """TMA K^_j, V^_j (rows kv_row0 + j BN of the [B Hkv LKP, D] views) into KVRing slot
        j % STAGES once both consumers released it (a fresh barrier passes the parity-1 wait);
        SMOOTH: also keys [j BN, (j + 1) BN) of correction row c_row, on K^_j's barrier, in three
        bf16 parts written by this warp (`_corr_parts`)."""
        BN: gl.constexpr = k_desc.block_type.shape[0]
        STAGES: gl.constexpr = ring.STAGES
        SMOOTH: gl.constexpr = ring.SMOOTH
        if SMOOTH:  # the next tile's correction keys in flight while this tile waits (see _corr_row)
            c_next = _corr_row(c_desc, c_row, LKP, 0, BN)
        for j in range(n_tiles):
            slot = j % STAGES
            phase = ((j // STAGES) & 1) ^ 1
            if SMOOTH:
                c = c_next
                c_next = _corr_row(c_desc, c_row, LKP, (j + 1) * BN, BN)
            mbarrier.wait(ring.k_empty.index(slot), phase)
            mbarrier.expect(ring.k_ready.index(slot), k_desc.block_type.nbytes)
            _tma_load(k_desc, [kv_row0 + j * BN, 0], ring.k_ready.index(slot), ring.k.index(slot))
            if SMOOTH:
                ring.c.index(slot).store(_corr_parts(c))
                fence_async_shared()  # the generic-proxy stores before the wgmma (async proxy) reads them
                mbarrier.arrive(ring.k_ready.index(slot))  # the barrier's second arrival (init count 2)
            mbarrier.wait(ring.v_empty.index(slot), phase)
            mbarrier.expect(ring.v_ready.index(slot), v_desc.block_type.nbytes)
            _tma_load(v_desc, [kv_row0 + j * BN, 0], ring.v_ready.index(slot), ring.v.index(slot))

    @gluon.jit
    def _corr_row(Corr, c_row, LKP, start_n, BN: gl.constexpr):
        """Keys [start_n, start_n + BN) of fp32 correction row c_row of Corr [*, LKP] (0 past LKP),
        in `_corr_parts`' layout. The producer loads a tile's keys one tile ahead: the row streams
        from HBM (the correction of a chunk outgrows L2), and a load waited for in the loop held
        each K^ barrier back by its latency (benchmarks/NOTES.md, v15g)."""
        lay: gl.constexpr = gl.BlockedLayout([16, BN // 32], [1, 32], [1, 1], [1, 0])
        cols = start_n + gl.arange(0, BN, layout=gl.SliceLayout(0, lay))
        return gl.load(Corr + c_row.to(gl.int64) * LKP + cols, mask=cols < LKP, other=0.0)

    @gluon.jit
    def _corr_parts(c):
        """A tile's correction keys c (fp32 [BN], `_corr_row`) as a [16, BN] bf16 B operand: rows 0-2
        the parts p0 + p1 + p2 = c exactly (p0 the top 16 bits of c, p1 those of c - p0, p2 the
        rest: <= 8 significant bits; Inf / NaN in p0 alone), rows 3-15 zero; one warp."""
        BN: gl.constexpr = c.shape[0]
        lay: gl.constexpr = c.type.layout.parent
        hi = (c.to(gl.int32, bitcast=True) & -65536).to(gl.float32, bitcast=True)
        r = c - hi
        mid = (r.to(gl.int32, bitcast=True) & -65536).to(gl.float32, bitcast=True)
        finite = gl.abs(c) < float("inf")
        p0 = gl.where(finite, hi, c).to(gl.bfloat16)[None, :]
        p1 = gl.where(finite, mid, 0.0).to(gl.bfloat16)[None, :]
        p2 = gl.where(finite, r - mid, 0.0).to(gl.bfloat16)[None, :]
        rows = gl.arange(0, 16, layout=gl.SliceLayout(1, lay))[:, None]
        zero = gl.zeros([16, BN], gl.bfloat16, lay)
        return gl.where(rows == 0, p0, gl.where(rows == 1, p1, gl.where(rows == 2, p2, zero)))

    @gluon.jit
    def _qk(q_smem, ring, slot, zero):
        """Issue S = Q^ K^_slot^T (async; K^ landed), SMOOTH: from the correction row qm K^T as the
        initial accumulator (exact in fp32; the `tl` kernel's `s + corr` becomes the same), made by
        one k16 wgmma, ones [R, 16] (columns 0-2) x the row's three bf16 parts (no loads or moves
        per tile)."""
        if ring.SMOOTH:
            R: gl.constexpr = zero.shape[0]
            dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=zero.type.layout, k_width=2)
            col = gl.arange(0, 16, layout=gl.SliceLayout(0, dot_a))[None, :]
            ones = gl.where(
                col < 3, gl.full([R, 16], 1.0, gl.bfloat16, dot_a), gl.zeros([R, 16], gl.bfloat16, dot_a)
            )
            acc = warpgroup_mma(ones, ring.c.index(slot), zero, use_acc=False, is_async=True)
            s = warpgroup_mma(q_smem, ring.k.index(slot).permute((1, 0)), acc, use_acc=True, is_async=True)
        else:
            s = warpgroup_mma(q_smem, ring.k.index(slot).permute((1, 0)), zero, use_acc=False, is_async=True)
        return s

    @gluon.jit
    def _softmax(s, m, l, start_n, keys, MASKED: gl.constexpr):
        """(m_new, alpha, l after tile j, P^ as the bf16 A operand) of scores s (KeyLoop keys), with
        the `tl` kernel's operations (`online_softmax.p_tile`) and reduction layouts; MASKED: keys
        past Lk get -inf (the tiles with such keys; where(valid, s, -inf) is s itself elsewhere, so
        the fast tiles skip it)."""
        R: gl.constexpr = s.shape[0]
        BN: gl.constexpr = s.shape[1]
        PNQ: gl.constexpr = keys.CAST[0]
        dot_a: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s.type.layout, k_width=2)
        if MASKED:
            offs_n = start_n + gl.arange(0, BN, layout=gl.SliceLayout(0, s.type.layout))
            s = gl.where(offs_n[None, :] < keys.Lk, s, float("-inf"))
        m_new, alpha, p3, p_hat3, _two_e = p_tile(s, m, keys.qk_scale, keys.CAST)
        if not PNQ:
            l = alpha * l + gl.convert_layout(gl.sum(gl.reshape(p3, [R, BN]), 1), alpha.type.layout)
        p = gl.convert_layout(gl.reshape(p_hat3, [R, BN]).to(gl.bfloat16), dot_a)
        if PNQ:
            l = alpha * l + gl.convert_layout(gl.sum(gl.sum(p_hat3, 1), 1), alpha.type.layout)
        return m_new, alpha, l, p

    @gluon.jit
    def _overlap_step(j, m, l, o_tilde, p, q_smem, ring, zero, keys, MASKED: gl.constexpr):
        """Key tile j >= 1 with the overlap: S_j and P^_{j-1} V^_{j-1} in flight together, the
        softmax of S_j under the latter; then O~ (P^_{j-1} V^_{j-1} added) times alpha_j."""
        BN: gl.constexpr = ring.k.type.shape[1]
        STAGES: gl.constexpr = ring.STAGES
        slot = j % STAGES
        prev = (j - 1) % STAGES
        mbarrier.wait(ring.k_ready.index(slot), (j // STAGES) & 1)
        mbarrier.wait(ring.v_ready.index(prev), ((j - 1) // STAGES) & 1)
        s = _qk(q_smem, ring, slot, zero)
        o_tilde = warpgroup_mma(p, ring.v.index(prev), o_tilde, is_async=True)
        s, _k_done = warpgroup_mma_wait(1, deps=[s, ring.k.index(slot)])
        mbarrier.arrive(ring.k_empty.index(slot))
        m, alpha, l, p_next = _softmax(s, m, l, j * BN, keys, MASKED)
        # The wait for P^_{j-1} V^_{j-1} behind an always-true branch (tile j holds keys): without it
        # ptxas places the wait before the softmax's exps (SASS line 162 of 932, though PTX has it
        # here and no register needs it earlier), so the product overlapped the block maxima only;
        # the branch ends the softmax's basic block, which ptxas does not move the wait out of (same
        # bits, kernel -4.4 % at 16k: benchmarks/NOTES.md, v13-late). The other arm (never run) opens
        # with a barrier so that LLVM cannot merge the arms and hoist the wait back.
        if j * BN < keys.Lk:
            o_done, _v_done, _p_done = warpgroup_mma_wait(0, deps=[o_tilde, ring.v.index(prev), p])
        else:
            _cta_barrier()
            o_done, _v_done, _p_done = warpgroup_mma_wait(0, deps=[o_tilde, ring.v.index(prev), p])
        mbarrier.arrive(ring.v_empty.index(prev))
        o_tilde = o_done * gl.convert_layout(alpha, gl.SliceLayout(1, o_done.type.layout))[:, None]
        return m, l, o_tilde, p_next

    @gluon.jit
    def _consumer(q, ring, keys, epi):
        """Rows [row0, row0 + 64) of this CTA's query tile (QTile q): the key loop over the KVRing
        ring (KeyLoop keys) and the epilogue (Epilogue epi). O goes through q_smem and o_desc where
        epi.O_TMA, else by gl.store."""
        q_smem = q.q_smem
        R: gl.constexpr = q_smem.type.shape[0]
        BN: gl.constexpr = ring.k.type.shape[1]
        DV: gl.constexpr = ring.v.type.shape[2]
        STAGES: gl.constexpr = ring.STAGES
        mma: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, BN, 16]
        )
        _q_hat_to_smem(q)
        zero = gl.zeros([R, BN], gl.float32, mma)
        o_tilde = gl.zeros([R, DV], gl.float32, mma)
        # m and l in the layout the block-max reduction gives (that of the `tl` kernel's m and l).
        m = gl.max(
            gl.max(gl.reshape(gl.full([R, BN], float("-inf"), gl.float32, mma), [R, BN // 32, 32]), 2), 1
        )
        l = gl.zeros_like(m)
        n_tiles = keys.n_tiles
        n_full = keys.Lk // BN  # tiles whose keys are all valid: no select on their scores
        mbarrier.wait(ring.k_ready.index(0), 0)
        s = _qk(q_smem, ring, 0, zero)
        s, _k_done = warpgroup_mma_wait(0, deps=[s, ring.k.index(0)])
        mbarrier.arrive(ring.k_empty.index(0))
        m, alpha, l, p = _softmax(s, m, l, 0, keys, True)
        o_tilde = o_tilde * gl.convert_layout(alpha, gl.SliceLayout(1, mma))[:, None]
        for j in range(1, n_full):
            m, l, o_tilde, p = _overlap_step(j, m, l, o_tilde, p, q_smem, ring, zero, keys, False)
        for j in range(gl.maximum(n_full, 1), n_tiles):
            m, l, o_tilde, p = _overlap_step(j, m, l, o_tilde, p, q_smem, ring, zero, keys, True)
        last = (n_tiles - 1) % STAGES
        mbarrier.wait(ring.v_ready.index(last), ((n_tiles - 1) // STAGES) & 1)
        o_tilde = warpgroup_mma(p, ring.v.index(last), o_tilde, is_async=True)
        o_tilde, _v_done, _p_done = warpgroup_mma_wait(0, deps=[o_tilde, ring.v.index(last), p])
        mbarrier.arrive(ring.v_empty.index(last))

        # O and lse in the layout of O~'s rows (the `tl` kernel's finish, `online_softmax`).
        l_rows = gl.convert_layout(l, gl.SliceLayout(1, mma))
        m_rows = gl.convert_layout(m, gl.SliceLayout(1, mma))
        out = finish_o(o_tilde, l_rows, epi.OUT_MAX)
        lse = finish_lse(l_rows, m_rows)
        rows = q.row0 + gl.arange(0, R, layout=gl.SliceLayout(1, mma))
        if epi.O_TMA:
            # q_smem is free: every wgmma that read it has been waited for.
            o_desc = epi.o_desc
            o_smem = _smem_as(q_smem, o_desc.dtype, [R, DV], q_smem.type.layout)
            o_smem.store(out.to(o_desc.dtype))
            fence_async_shared()
            _cta_barrier()  # every thread's part of O is in shared memory before the TMA reads it
            _tma_store(
                o_desc,
                [epi.b, epi.h, q.row0, 0],
                _smem_as(q_smem, o_desc.dtype, [1, 1, R, DV], o_desc.layout),
            )
        else:
            cols = gl.arange(0, DV, layout=gl.SliceLayout(0, mma))
            optr = (
                epi.Out
                + epi.out_base
                + rows[:, None].to(gl.int64) * epi.stride_om
                + cols[None, :] * epi.stride_od
            )
            gl.store(
                optr, out.to(epi.Out.dtype.element_ty), mask=(rows[:, None] < epi.Lq) & (cols[None, :] < DV)
            )
        gl.store(epi.Lse + epi.lse_base + rows, lse, mask=rows < epi.Lq)
        if epi.O_TMA:
            tma.store_wait(pendings=0)  # q_smem stays allocated until the store has read it

    @gluon.jit
    def _cta_heads(H, GROUP):
        """(pid_m, b, h, bh, bhk) of this CTA: its query tile, (batch, query head) and KV head bhk
        (GQA: no copy)."""
        pid_m = gl.program_id(0)
        bh = gl.program_id(1)
        b = bh // H
        h = bh % H
        return pid_m, b, h, bh, b * (H // GROUP) + h // GROUP

    @gluon.jit
    def _ring_barriers(STAGES: gl.constexpr, K_ARRIVALS: gl.constexpr):
        """The K^ / V^ ring's mbarriers, initialized: (k_ready (K_ARRIVALS arrivals), v_ready (1),
        k_empty, v_empty (2: one per consumer partition)), STAGES each."""
        k_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        k_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        v_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(k_ready.index(i), count=K_ARRIVALS)
            mbarrier.init(v_ready.index(i), count=1)
            mbarrier.init(k_empty.index(i), count=2)
            mbarrier.init(v_empty.index(i), count=2)
        return k_ready, v_ready, k_empty, v_empty

    @gluon.jit
    def _tile_rows(pid_m, LQP, Lk, Lq, b, h, bh, stride_ob, stride_oh, R: gl.constexpr, BN: gl.constexpr):
        """(n_tiles, row0, q_row0, out_base, lse_base): the key tiles, this CTA's first query row
        (of 2 R), that row in the [B H LQP] rows of Q^, and the (batch, head)'s offsets of O and lse."""
        row0 = pid_m * (2 * R)
        return (
            (Lk + BN - 1) // BN,
            row0,
            bh.to(gl.int64) * LQP + row0,
            b.to(gl.int64) * stride_ob + h.to(gl.int64) * stride_oh,
            bh.to(gl.int64) * Lq,
        )

    @gluon.jit
    def _mx_attention_fwd_hopper_kernel(
        Qc,
        Qs,
        k_desc,
        v_desc,
        c_desc,
        Out,
        o_desc,
        Lse,
        qk_scale,
        Lq,
        Lk,
        H,
        GROUP,
        LQP,
        LKP,
        NBQ,
        stride_ob,
        stride_oh,
        stride_om,
        stride_od,
        DQ: gl.constexpr,
        PNQ: gl.constexpr,
        CEIL: gl.constexpr,
        Q_EXP: gl.constexpr,
        Q_MANT: gl.constexpr,
        P_ELEM: gl.constexpr,
        P_CVT: gl.constexpr,
        QK_ELEM: gl.constexpr,
        OUT_MAX: gl.constexpr,
        STAGES: gl.constexpr,
        CONSUMER_REGS: gl.constexpr,
        PRODUCER_REGS: gl.constexpr,
        SMOOTH_Q_BLOCK: gl.constexpr,
        O_TMA: gl.constexpr,
    ):
        BN: gl.constexpr = k_desc.block_type.shape[0]
        DV: gl.constexpr = v_desc.block_type.shape[1]
        R: gl.constexpr = 64
        pid_m, b, h, bh, bhk = _cta_heads(H, GROUP)
        q_layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([R, DQ], gl.bfloat16)
        q0 = gl.allocate_shared_memory(gl.bfloat16, [R, DQ], q_layout)
        q1 = gl.allocate_shared_memory(gl.bfloat16, [R, DQ], q_layout)
        k_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, DQ], k_desc.layout)
        v_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, BN, DV], v_desc.layout)
        # Q smoothing's correction Corr [B Hq NBQ, LKP] (fp32): this CTA's rows lie in one block.
        SMOOTH: gl.constexpr = SMOOTH_Q_BLOCK > 0
        if SMOOTH:
            parts: gl.constexpr = gl.NVMMASharedLayout.get_default_for([16, BN], gl.bfloat16)
            c_smem = gl.allocate_shared_memory(gl.bfloat16, [STAGES, 16, BN], parts)
        else:
            c_smem = k_smem  # never read
        k_ready, v_ready, k_empty, v_empty = _ring_barriers(STAGES, 2 if SMOOTH else 1)  # + the parts
        # Two mbarriers no partition reads (the removed ping-pong's turns). Without them ptxas orders
        # the consumers' key loops differently (same instructions per tile, Triton 3.6 and 3.9,
        # 2026-12-03), so they stay until an H200 A/B shows that order costs nothing.
        turns = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(turns.index(i), count=1)
        n_tiles, row0, q_row0, out_base, lse_base = _tile_rows(
            pid_m, LQP, Lk, Lq, b, h, bh, stride_ob, stride_oh, R, BN
        )
        c_row = bh * NBQ + row0 // gl.maximum(SMOOTH_Q_BLOCK, 1)
        # Built once, read by both consumers (the producer shares the ring).
        ring = KVRing(k_smem, v_smem, c_smem, k_ready, v_ready, k_empty, v_empty, SMOOTH)
        keys = KeyLoop(qk_scale, Lk, n_tiles, (PNQ, CEIL, Q_EXP, Q_MANT, P_ELEM, P_CVT, False))
        epi = Epilogue(Out, Lse, o_desc, b, h, out_base, lse_base, stride_om, stride_od, Lq, OUT_MAX, O_TMA)
        gl.warp_specialize(
            [
                (_consumer, (QTile(Qc, Qs, q0, q_row0, row0, QK_ELEM), ring, keys, epi)),
                (_consumer, (QTile(Qc, Qs, q1, q_row0 + R, row0 + R, QK_ELEM), ring, keys, epi)),
                (_producer, (k_desc, v_desc, c_desc, ring, bhk * LKP, c_row, LKP, n_tiles)),
            ],
            [4, 1],
            [CONSUMER_REGS, PRODUCER_REGS],
        )  # fmt: skip


def gluon_fwd_reason(
    *,
    kv_bf16: bool,
    dq: int,
    dv: int,
    block_n: int,
    is_causal: bool = False,
    masked: bool = False,
    varlen: bool = False,
    debug_p: bool = False,
    smooth_q_block: int = 0,
    p_elem: str = "e2m1",
    qk_elem: str = "e2m1",
    scale: float = 1.0,
) -> str | None:
    """None if `mx_attention_fwd_hopper` computes this call, else why not (the `tl` kernel serves it)."""
    if not HAS_GLUON:
        return "this Triton has no Gluon Hopper layer (triton.experimental.gluon)"
    if not kv_bf16:
        return "the Gluon kernel reads bf16 K^ / V^ (kv_layout='bf16'), not packed codes"
    if (dq, dv) != (HEAD_DIM, HEAD_DIM):
        return f"head dims ({dq}, {dv}): the Gluon kernel is built for {HEAD_DIM}"
    if block_n != BLOCK_N:
        return f"block_n={block_n}: the Gluon kernel takes {BLOCK_N} keys per tile"
    extras = dict(is_causal=is_causal, mask=masked, varlen=varlen, debug_p=debug_p)
    named = [k for k, v in extras.items() if v]
    if named:
        return f"{', '.join(named)}: the Gluon kernel serves dense unmasked calls only"
    if smooth_q_block % BLOCK_M:
        return (
            f"smooth_q_block={smooth_q_block}: the Gluon kernel's {BLOCK_M}-row tiles must lie in one block"
        )
    if p_elem not in KERNEL_ELEMS or qk_elem not in KERNEL_ELEMS:
        return f"element ladders ({p_elem!r}, {qk_elem!r}) must be in {KERNEL_ELEMS}"
    if not (scale > 0 and math.isfinite(scale * LOG2E)):
        return f"scale={scale!r}: the kernels' constant scale * log2(e) must be a positive fp32"
    return None


def fwd_kernel_for(target: Target | None, reason: str | None, requested: str | None = None) -> str:
    """The forward kernel of a call on `target`: "gluon" or "tl". `reason` is `gluon_fwd_reason`'s
    for the call; `requested` None picks "gluon" where `targets.GLUON_FWD` lists the family and the
    call is served (both compute the same bits), an explicit "gluon" that cannot run raises."""
    if requested is not None and requested not in FWD_KERNELS:
        raise ValueError(f"fwd_kernel must be one of {FWD_KERNELS} or None, got {requested!r}")
    if requested == "gluon":
        if target is None or target.family != "sm_90":
            reason = f"the Gluon forward is built for sm_90, this call runs on {target.name if target else 'the CPU interpreter'}"
        if reason is not None:
            raise ValueError(f"fwd_kernel='gluon' cannot serve this call: {reason}")
        return "gluon"
    if requested is None and target is not None and target.family in targets.GLUON_FWD and reason is None:
        return "gluon"
    return "tl"


@dataclass(frozen=True)
class GluonFwdCall:
    """One launch of the Gluon kernel: grid, positional arguments, constexprs, warps (the default
    partition's: consumer 0)."""

    grid: tuple[int, int]
    args: tuple
    constants: dict
    num_warps: int = 4
    spec: FwdSpec | None = None


@functools.cache
def _shared_layout(shape: tuple[int, ...], dtype) -> object:
    """The default NVMMA shared layout of a TMA box (built once per box and dtype, not per call)."""
    return gl.NVMMASharedLayout.get_default_for(list(shape), dtype)


def out_tma_ok(out: torch.Tensor) -> bool:
    """Whether TMA can write out [B, Hq, Lq, 128]: a 2-byte dtype, unit last stride, 16-byte aligned
    base and strides (the planner's `o_tma` of a call, with `OUT_TMA`)."""
    return (
        out.dtype in (torch.bfloat16, torch.float16)
        and out.stride(-1) == 1
        and out.data_ptr() % 16 == 0
        and all(st % 8 == 0 for st in out.stride()[:-1])
    )


def _out_desc(out: torch.Tensor) -> TensorDescriptor:
    """A [B, Hq, Lq, 128] TMA descriptor over out's own strides, boxes of one consumer's [1, 1, 64, 128]."""
    dt = gl.bfloat16 if out.dtype == torch.bfloat16 else gl.float16
    box = [1, 1, BLOCK_M // 2, HEAD_DIM]
    return TensorDescriptor(out, list(out.shape), list(out.stride()), box, _shared_layout(tuple(box), dt))


def gluon_fwd_call(
    q_packed: tuple[torch.Tensor, torch.Tensor],
    kx: torch.Tensor,
    vx: torch.Tensor,
    *,
    lq: int,
    lk: int,
    group: int,
    out: torch.Tensor,
    p_rule: tuple[bool, int, int],
    pnq: bool,
    scale: float,
    p_elem: str = "e2m1",
    qk_elem: str = "e2m1",
    p_cvt: bool | None = None,
    lse: torch.Tensor | None = None,
    smooth_q: tuple[torch.Tensor, int] | None = None,
) -> tuple[torch.Tensor, GluonFwdCall]:
    """(lse [B, Hq, Lq], the launch) for pre-pass outputs: Q^ = (codes [B, Hq, LQP, DQ/2] (E4M3:
    [.., DQ]), E8M0 bytes [B, Hq, LQP, DQ/32]), K^ [B, Hkv, LKP, 128] and V^ [B, Hkv, LKP, 128]
    bf16 (contiguous), out [B, Hq, Lq, 128] (any strides), as `attention_fwd.fwd_calls` takes
    them; smooth_q = (corr [B, Hq, ceil(Lq / block), LKP] fp32 contiguous, block): Q smoothing's
    correction (`smoothing.smoothing_correction`), block a multiple of 128. p_cvt None: the
    hardware E4M3 cast where `targets.HW_E4M3_CAST` lists the target."""
    qc = q_packed[0]
    bsz, hq, lqp, _ = qc.shape
    hk, lkp = kx.shape[1], kx.shape[2]
    if lqp % BLOCK_M or lkp % BLOCK_N or kx.shape[3] != HEAD_DIM or tuple(vx.shape) != tuple(kx.shape):
        raise ValueError(
            f"Q^ rows {lqp} must be a multiple of {BLOCK_M}, K^ / V^ [B, Hkv, LKP % {BLOCK_N} == 0, "
            f"{HEAD_DIM}] alike; got K^ {tuple(kx.shape)}, V^ {tuple(vx.shape)}"
        )
    if (
        kx.dtype != torch.bfloat16
        or vx.dtype != torch.bfloat16
        or not (kx.is_contiguous() and vx.is_contiguous())
    ):
        raise ValueError("K^ and V^ must be contiguous bf16 tensors (the pre-pass's bf16 layout)")
    if hq != hk * group or out.shape != (bsz, hq, lq, HEAD_DIM):
        raise ValueError(
            f"heads {hq} = {hk} x group {group} and out [B, Hq, Lq, 128] expected, got {tuple(out.shape)}"
        )
    if bsz * hk * lkp >= 2**31 or lk < 1:
        raise ValueError(
            f"K^ rows B x Hkv x LKP = {bsz * hk * lkp} must be in [1, 2**31) (TMA's int32 row coordinate)"
        )
    if p_cvt is None:
        p_cvt = p_elem == "e4m3" and hw_e4m3_cast(current_target(qc.device))
    spec = gluon_fwd_spec(
        p_rule=p_rule, pnq=pnq, out_dtype=out.dtype, o_tma=OUT_TMA and out_tma_ok(out), p_elem=p_elem,
        qk_elem=qk_elem, p_cvt=p_cvt, smooth_q_block=0 if smooth_q is None else smooth_q[1],
    )  # fmt: skip
    return gluon_launch(spec, q_packed, kx, vx, lq=lq, lk=lk, group=group, out=out, scale=scale, lse=lse,
                        smooth_q=smooth_q)  # fmt: skip


def gluon_launch(
    spec: FwdSpec,
    q_packed: tuple[torch.Tensor, torch.Tensor],
    kx: torch.Tensor,
    vx: torch.Tensor,
    *,
    lq: int,
    lk: int,
    group: int,
    out: torch.Tensor,
    scale: float,
    lse: torch.Tensor | None = None,
    smooth_q: tuple[torch.Tensor, int] | None = None,
) -> tuple[torch.Tensor, GluonFwdCall]:
    """(lse, the launch) of `spec` (`gluon_fwd_spec`) on these tensors (see `gluon_fwd_call`):
    reads the spec and the tensors, nothing else."""
    c = spec.constants
    qc, qs = q_packed
    bsz, hq, lqp, _ = qc.shape
    hk, lkp = kx.shape[1], kx.shape[2]
    c_desc, nbq, blk = None, 1, 0
    if smooth_q is not None:
        corr, blk = smooth_q
        nbq = -(-lq // blk) if blk > 0 else 0
        if (
            blk <= 0
            or blk % BLOCK_M
            or corr.dtype != torch.float32
            or tuple(corr.shape) != (bsz, hq, nbq, lkp)
            or not corr.is_contiguous()
        ):
            raise ValueError(
                f"smooth_q = (corr, block): block a positive multiple of {BLOCK_M} and corr contiguous fp32 "
                f"[B, Hq, ceil(Lq / block), LKP] = {[bsz, hq, nbq, lkp]} expected, got block {blk}, corr "
                f"{tuple(corr.shape)} {corr.dtype}"
            )
        c_desc = corr  # the producer reads the rows itself (`_corr_row`)
    assert blk == c["SMOOTH_Q_BLOCK"], (blk, c["SMOOTH_Q_BLOCK"])
    if lse is None:
        lse = torch.empty((bsz, hq, lq), dtype=torch.float32, device=qc.device)
    layout = _shared_layout((BLOCK_N, HEAD_DIM), gl.bfloat16)
    k2, v2 = kx.view(bsz * hk * lkp, HEAD_DIM), vx.view(bsz * hk * lkp, HEAD_DIM)
    k_desc = TensorDescriptor(k2, list(k2.shape), list(k2.stride()), [BLOCK_N, HEAD_DIM], layout)
    v_desc = TensorDescriptor(v2, list(v2.shape), list(v2.stride()), [BLOCK_N, HEAD_DIM], layout)
    o_desc = _out_desc(out) if c["O_TMA"] else None
    args = (qc, qs, k_desc, v_desc, c_desc, out, o_desc, lse, scale * LOG2E, lq, lk, hq, group, lqp, lkp, nbq,
            *out.stride())  # fmt: skip
    return lse, GluonFwdCall((lqp // BLOCK_M, bsz * hq), args, c, spec.num_warps, spec)


def mx_attention_fwd_hopper(
    q_packed: tuple[torch.Tensor, torch.Tensor], kx: torch.Tensor, vx: torch.Tensor, **kwargs: object
) -> torch.Tensor:
    """Run the Gluon kernel on pre-pass outputs (the arguments of `gluon_fwd_call`, or with `spec` a
    plan's `KernelPlan.fwd` those of `gluon_launch`, and `slot` its slot in a cached plan,
    `launch.launch`); writes `out`, returns lse [B, Hq, Lq]."""
    spec, slot = kwargs.pop("spec", None), kwargs.pop("slot", None)
    if spec is None:
        lse, call = gluon_fwd_call(q_packed, kx, vx, **kwargs)
    else:
        lse, call = gluon_launch(spec, q_packed, kx, vx, **kwargs)
    launch(_mx_attention_fwd_hopper_kernel, call.grid, call.args, call.spec.launch_kwargs, slot)
    return lse


def gluon_fwd_spec(
    *,
    p_rule: tuple[bool, int, int],
    pnq: bool,
    out_dtype: torch.dtype,
    o_tma: bool,
    p_elem: str = "e2m1",
    qk_elem: str = "e2m1",
    p_cvt: bool = False,
    smooth_q_block: int = 0,
) -> FwdSpec:
    """The `attention_fwd_hopper` launch of a call: Q smoothing's block (`smooth_q_block`, 0 for
    none; the producer then writes the correction's parts), O by TMA store (`o_tma`: where out takes
    a descriptor, `out_tma_ok`), the hardware E4M3 cast (`p_cvt`); the ring's
    STAGES and the partitions' registers are the module's."""
    constexprs = dict(
        DQ=HEAD_DIM,
        **softmax_constexprs(p_rule, pnq, out_dtype),
        P_ELEM=p_elem,
        P_CVT=bool(p_cvt and p_elem == "e4m3"),
        QK_ELEM=qk_elem,
        STAGES=STAGES,
        CONSUMER_REGS=CONSUMER_REGS,
        PRODUCER_REGS=PRODUCER_REGS_CORR if smooth_q_block else PRODUCER_REGS,
        SMOOTH_Q_BLOCK=smooth_q_block,
        O_TMA=o_tma,
    )
    return FwdSpec(FwdKernel.GLUON, tuple(constexprs.items()), NUM_WARPS)
