"""The rotated passes on Hopper, as Gluon kernels (Triton's explicit-layout layer).

Each computes exactly what `prepass._qk_prepass_kernel` computes for its case, from the same
helpers (`hadamard_rows`, `cast_blocks`, `cast_packed`), so the bytes are identical (GPU tests in
`tests/kernels/test_gpu.py`). What differs is where the data lives, which Triton's automatic
layouts could not get right for these passes (benchmarks/NOTES.md, v6a, v7, v9):

- `prepass_k_bf16` (K^, bf16 out): a persistent kernel; each program owns a strided set of
  [BL, 128] row tiles and copies tile i + 1 into shared memory (cp.async, coalesced 16-byte
  chunks) while it rotates and casts tile i on one row per thread; the bf16 result goes back
  through shared memory to coalesced stores. 74-77 % of the copy bandwidth on the H200, against
  65-68 % for the `tl` kernel.
- `prepass_q_packed` (Q^, packed out): each row on two lanes, 64 columns each, so a thread holds
  half as many values (96 registers instead of 168). The first six butterfly levels stay in the
  thread; the last one (columns j, j + 64) takes the partner lane's value by one shuffle and one
  fma; the codes of 8 values go into their word in one asm block (`_pack_words`). Persistent
  one-warp programs take row tiles through a ring of two TMA buffers (the next tile's copy runs
  while this one is cast, and needs no registers), and the codes leave through shared memory by
  TMA: global loads straight into the row layout had each warp's 16-byte loads touch 32 lines,
  and their latency was the pass's largest stall. 72-74 % of the copy bandwidth on the H200 (64 %
  with those loads, 55 % for the `tl` kernel). With Q smoothing each tile loads its 128-row
  block's mean row (a lane's 64 contiguous floats, the same for all its rows) and subtracts it in
  fp32 before the rotation, as the `tl` pass does.

Both are used by `prepass.prepass_qk` on sm_90 only (where they were measured), for head dim 128;
Gluon is experimental, so a Triton that cannot build one falls back to the `tl` kernel with one
warning.
"""

from __future__ import annotations

import functools

import torch

from mxattention.kernels._triton import sm_count
from mxattention.kernels.cast import bf16_pair_floats, cast_blocks, cast_packed
from mxattention.kernels.hadamard import hadamard_rows
from mxattention.kernels.launch import launch
from mxattention.kernels.specs import BuildFailure
from mxattention.kernels.targets import SM_90A, current_target

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    # Renamed after Triton 3.6 (the old names are gone or raise); same arguments.
    _async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    _tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared
    _tma_store = getattr(tma, "async_store", None) or tma.async_copy_shared_to_global
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    HAS_GLUON = True
except (ImportError, AttributeError):  # no Triton, or one without Gluon's cp.async and TMA
    HAS_GLUON = False

# K^: (rows per tile, warps, pipeline stages, programs per SM); H200 sweep (git show f26ce6e:benchmarks/results/raw/
# prepass_gluon_pipe_v7_h200.json): 2 programs of 4 warps (188 registers per thread) fill an SM.
TILE_ROWS, WARPS, STAGES, PROGRAMS_PER_SM = 128, 4, 2, 2
# K^ with fewer tiles than those programs (short keys: cross-attention's 512): tiles of 32 rows, one
# warp each, spread the few rows over every SM (40 heads x 512 keys: 7.0 -> 6.6 us on the H200,
# git show f26ce6e:benchmarks/results/raw/prepass_small_kv_v10_h200.json).
SMALL_TILE_ROWS, SMALL_WARPS, SMALL_PROGRAMS_PER_SM = 32, 1, 8
# Q^: warps per program (16 rows each), TMA ring stages, registers per thread (ptxas gives the loop
# 128 unbounded; 96 keeps 20 programs per SM without spills at 1 warp), programs per SM in the grid
# (two waves of the 20 resident: shorter programs balance better); H200 sweep in
# git show f26ce6e:benchmarks/results/raw/prepass_q_tma_v10_h200.json.
Q_WARPS, Q_STAGES, Q_MAXNREG, Q_PROGRAMS_PER_SM = 1, 2, 96, 40
HEAD_DIM = 128

if HAS_GLUON:

    @gluon.jit
    def _copy_tile(dst, t, src, BL: gl.constexpr, DP: gl.constexpr):
        """Start the cp.async of row tile t (zeros past L and for t >= n_tiles) into dst; src holds
        the kernel's constant arguments (X, n_tiles, tiles_per_head, L, H, strides / 8, rows, cols)."""
        X, n_tiles, tiles_per_head, L, H, stride_b8, stride_h8, stride_l8, rows, cols = src
        bh = t // tiles_per_head
        b = bh // H
        r = (t - bh * tiles_per_head) * BL + rows
        # Strides come in 16-byte units (stride8 = stride / 8 elements): the compiler can then prove
        # every chunk aligned for cp.async whatever the strides' own divisibility.
        ptrs = X + (b.to(gl.int64) * stride_b8 + (bh - b * H).to(gl.int64) * stride_h8) * 8
        ptrs = ptrs + (r[:, None].to(gl.int64) * stride_l8) * 8 + cols[None, :]
        # The column term only gives the mask the tile's shape (every column is in the head).
        _async_load(dst, ptrs, mask=(r[:, None] < L) & (cols[None, :] < DP) & (t < n_tiles))

    @gluon.jit
    def _k_bf16_pipelined_kernel(
        X,
        Out,
        L,
        H,
        stride_b8,
        stride_h8,
        stride_l8,
        L_PAD,
        n_tiles,
        tiles_per_head,
        BL: gl.constexpr,
        DP: gl.constexpr,
        STAGES: gl.constexpr,
        ROT_LEVELS: gl.constexpr,
        ROT_NORM: gl.constexpr,
        CEIL: gl.constexpr,
        Q_EXP: gl.constexpr,
        Q_MANT: gl.constexpr,
    ):
        W: gl.constexpr = gl.num_warps()
        # 16-byte chunks: lanes along a row for global memory, one row per thread for the arithmetic.
        io: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (DP // 8), DP // 8], [W, 1], [1, 0])
        row: gl.constexpr = gl.BlockedLayout([1, DP], [32, 1], [W, 1], [1, 0])
        # Chunk index XOR (row mod 8): a warp reading one chunk of 32 rows hits every bank once per 8 rows.
        swizzled: gl.constexpr = gl.SwizzledSharedLayout(vec=8, per_phase=1, max_phase=8, order=[1, 0])
        buf = gl.allocate_shared_memory(X.dtype.element_ty, [STAGES, BL, DP], swizzled)
        pid = gl.program_id(0)
        nprog = gl.num_programs(0)
        rows = gl.arange(0, BL, layout=gl.SliceLayout(1, io))
        cols = gl.arange(0, DP, layout=gl.SliceLayout(0, io))
        src = (X, n_tiles, tiles_per_head, L, H, stride_b8, stride_h8, stride_l8, rows, cols)
        for s in gl.static_range(STAGES - 1):
            _copy_tile(buf.index(s), pid + s * nprog, src, BL, DP)
            async_copy.commit_group()
        i = 0
        for t in range(pid, n_tiles, nprog):
            _cta_barrier()  # every thread has read the stage the next copy overwrites
            _copy_tile(buf.index((i + STAGES - 1) % STAGES), t + (STAGES - 1) * nprog, src, BL, DP)
            async_copy.commit_group()
            async_copy.wait_group(STAGES - 1)
            _cta_barrier()  # every thread's copies into this stage have landed
            x = buf.index(i % STAGES).load(row).to(gl.float32)
            i += 1
            x = hadamard_rows(x, BL, DP, ROT_LEVELS, ROT_NORM)
            # The block max as Triton's reduction: Gluon has no layout for the in-thread tree's result.
            _, _, vals = cast_blocks(gl.reshape(x, [BL, DP // 32, 32]), CEIL, Q_EXP, Q_MANT, 2, False, "e2m1")
            out = gl.convert_layout(gl.reshape(vals, [BL, DP]).to(gl.bfloat16), io)
            bh = t // tiles_per_head
            out_rows = bh.to(gl.int64) * L_PAD + ((t - bh * tiles_per_head) * BL + rows[:, None]).to(gl.int64)
            gl.store(Out + out_rows * DP + cols[None, :], out)
        async_copy.wait_group(0)

    @gluon.jit
    def _block_layout(amax, y3):
        """Block maxima in the layout of y3 reduced over its last axis (`cast.cast_packed`'s hook)."""
        return gl.convert_layout(amax, gl.SliceLayout(2, y3.type.layout))

    @gluon.jit
    def _words_layout(keep, words):
        """A per-block mask [R, NB, 1] widened to the words' [R, NB, 4] and their layout
        (`cast._cast_words`' hook); the joins copy registers, the conversion moves nothing."""
        k2 = gl.reshape(gl.join(keep, keep), [keep.shape[0], keep.shape[1], 2])
        k4 = gl.reshape(gl.join(k2, k2), [keep.shape[0], keep.shape[1], 4])
        return gl.convert_layout(k4, words.type.layout)

    @gluon.jit
    def _split8(x):
        """The 8 interleaved parts of x [R, M * 8]: part i holds elements 8j + i, each [R, M]."""
        R: gl.constexpr = x.shape[0]
        M: gl.constexpr = x.shape[1] // 8
        ev, od = gl.split(gl.reshape(x, [R, M, 4, 2]))  # elements 0 2 4 6 | 1 3 5 7
        e04, e26 = gl.split(gl.reshape(ev, [R, M, 2, 2]))
        o15, o37 = gl.split(gl.reshape(od, [R, M, 2, 2]))
        x0, x4 = gl.split(e04)
        x2, x6 = gl.split(e26)
        x1, x5 = gl.split(o15)
        x3, x7 = gl.split(o37)
        return x0, x1, x2, x3, x4, x5, x6, x7

    @gluon.jit
    def _pack_words(lad, ps):
        """`cast._cast_words`' PACK hook: one int32 word per 8 values, in one asm block.

        lad = r * 2**-126 holds code i in bits 22-24 and nothing else, so lad_i >> (22 - 4i) (or
        << for i >= 6) puts it at nibble i: one shift-add each. The two left shifts are integer
        multiply-adds, by 4 + 2**10 and 64 + 2**10 (lad * 2**10 = code * 2**32 vanishes mod 2**32) so
        that ptxas cannot turn them back into shifts: they then run on the FMA pipe, not on the integer
        pipe, which this pass keeps busier (Nsight Compute, H200). The signs are bit 7 of each ps's top
        byte: byte permutes gather those of the odd values into bytes 0-3 (bits 7, 15, 23, 31: nibble
        bit 3 of values 1, 3, 5, 7) and of the even ones likewise, 4 bits further down after a shift.
        ~17 instructions per word where the compiler's code for `signed_nibbles` and
        `pack_nibble_words` took ~33.
        """
        R: gl.constexpr = lad.shape[0]
        NB: gl.constexpr = lad.shape[1]
        la = _split8(gl.reshape(lad, [R, NB * 32]).to(gl.uint32, bitcast=True))
        sg = _split8(gl.reshape(ps, [R, NB * 32]).to(gl.uint32, bitcast=True))
        w = gl.inline_asm_elementwise(
            """{ .reg .b32 c, t, p, q, o, e;
            shr.u32 c, $1, 22;
            shr.u32 t, $2, 18; add.u32 c, c, t;
            shr.u32 t, $3, 14; add.u32 c, c, t;
            shr.u32 t, $4, 10; add.u32 c, c, t;
            shr.u32 t, $5, 6; add.u32 c, c, t;
            shr.u32 t, $6, 2; add.u32 c, c, t;
            mad.lo.u32 c, $7, 1028, c;
            mad.lo.u32 c, $8, 1088, c;
            prmt.b32 p, $10, $12, 0x0073;
            prmt.b32 q, $14, $16, 0x7300;
            prmt.b32 o, p, q, 0x7610;
            prmt.b32 p, $9, $11, 0x0073;
            prmt.b32 q, $13, $15, 0x7300;
            prmt.b32 e, p, q, 0x7610;
            shr.u32 e, e, 4;
            and.b32 o, o, 0x80808080;
            and.b32 e, e, 0x08080808;
            or.b32 c, c, o;
            or.b32 $0, c, e; }""",
            "=r" + ",r" * 16,
            la + sg,
            dtype=gl.int32,
            is_pure=True,
            pack=1,
        )
        return gl.reshape(w, [R, NB, 4])

    @gluon.jit
    def _partner_lane(x):
        """Each register's value in the lane whose id differs in bit 0."""
        return gl.inline_asm_elementwise(
            "shfl.sync.bfly.b32 $0, $1, 1, 0x1f, 0xffffffff;",
            "=r,r",
            [x],
            dtype=gl.float32,
            is_pure=True,
            pack=1,
        )

    @gluon.jit
    def _tile_offsets(BL: gl.constexpr, N: gl.constexpr, layout: gl.constexpr):
        """Offsets (int32) of a [BL, 2, N] (row, half, j) tile in rows of 2 N elements, in `layout`."""
        r = gl.arange(0, BL, layout=gl.SliceLayout(1, gl.SliceLayout(2, layout)))
        half = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, layout)))
        j = gl.arange(0, N, layout=gl.SliceLayout(0, gl.SliceLayout(1, layout)))
        return r[:, None, None] * (2 * N) + half[None, :, None] * N + j[None, None, :]

    @gluon.jit
    def _fetch_q_tile(desc, buf, bar, b, h, tile, n_tiles):
        """Start the TMA copy of row tile `tile` of head (b, h) into buf, arriving on bar (nothing
        past the last tile; rows past L arrive as zeros)."""
        ok = tile < n_tiles
        mbarrier.expect(bar, desc.block_type.nbytes, pred=ok)
        _tma_load(desc, [b, h, tile * desc.block_type.shape[2], 0, 0], bar, buf, pred=ok)

    @gluon.jit
    def _q_packed_kernel(
        desc,
        codes_desc,
        Scales,
        H,
        L_PAD,
        n_tiles,
        QM,
        L,
        NB,
        NORM: gl.constexpr,
        FOLD_E_MAX: gl.constexpr,
        CEIL: gl.constexpr,
        Q_EXP: gl.constexpr,
        Q_MANT: gl.constexpr,
        STAGES: gl.constexpr,
        SMOOTH: gl.constexpr = 0,
    ):
        # Program (p, bh) takes row tiles p, p + P, ... of head bh. desc reads x [B, H, L, 128] as
        # int32 words [B, H, L, 2, 32] (bf16 pairs; a half row per [2] index), in boxes of
        # [1, 1, BL, 2, 32] with 128-byte swizzle: the 8 threads of a shared-memory phase read 8 half
        # rows, whose 16-byte chunks the swizzle spreads over every bank.
        W: gl.constexpr = gl.num_warps()
        BL: gl.constexpr = desc.block_type.shape[2]
        gl.static_assert(BL == 16 * W, "a tile is 16 rows per warp")
        # [row, half, j]: lane bit 0 picks the half of the row (order [2, 1, 0] fills dims 2, 1, 0
        # with lane bits in turn), so `_partner_lane` swaps the halves.
        words_l: gl.constexpr = gl.BlockedLayout([1, 1, 32], [16, 2, 1], [W, 1, 1], [2, 1, 0])
        vals_l: gl.constexpr = gl.BlockedLayout([1, 1, 64], [16, 2, 1], [W, 1, 1], [2, 1, 0])
        out_l: gl.constexpr = gl.BlockedLayout([1, 1, 8], [16, 2, 1], [W, 1, 1], [2, 1, 0])
        scale_l: gl.constexpr = gl.BlockedLayout([1, 1, 2], [16, 2, 1], [W, 1, 1], [2, 1, 0])
        buf = gl.allocate_shared_memory(gl.int32, [STAGES] + desc.block_type.shape, desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        out = gl.allocate_shared_memory(gl.int32, codes_desc.block_type.shape, codes_desc.layout)
        for s in gl.static_range(STAGES):
            mbarrier.init(bars.index(s), count=1)
        p0 = gl.program_id(0)
        n_p = gl.num_programs(0)
        bh = gl.program_id(1)
        b = bh // H
        h = bh - b * H
        for s in gl.static_range(STAGES):
            _fetch_q_tile(desc, buf.index(s), bars.index(s), b, h, p0 + s * n_p, n_tiles)
        half_v = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(2, vals_l)))
        sign = gl.where(half_v == 0, 1.0, -1.0)[None, :, None]
        scale_offs = _tile_offsets(BL, 2, scale_l)
        i = 0
        for tile in range(p0, n_tiles, n_p):
            st = i % STAGES
            mbarrier.wait(bars.index(st), (i // STAGES) & 1)
            w = buf.index(st).reshape([BL, 2, 32]).load(words_l)
            _cta_barrier()  # every warp has read stage st before the next copy lands in it
            _fetch_q_tile(desc, buf.index(st), bars.index(st), b, h, tile + STAGES * n_p, n_tiles)
            i += 1
            lo, hi = bf16_pair_floats(w)
            x = gl.reshape(gl.join(lo, hi), [BL, 2, 64])  # (row, half, element of the half)
            if SMOOTH > 0:
                # Q smoothing, as `prepass._qk_prepass_kernel`: fp32 x - qm of the block of SMOOTH
                # rows that holds this tile (QM [B * H, NB, 128]); each thread loads the 64
                # contiguous floats of its half row (16-byte loads, the same for every row); rows
                # past L back to +0.0 (tiles past the last block too).
                blk = gl.minimum((tile * BL) // SMOOTH, NB - 1)
                o = _tile_offsets(1, 64, vals_l)
                qm = gl.load(QM + (bh.to(gl.int64) * NB + blk) * 128 + o)
                x = x - gl.convert_layout(qm, x.type.layout)
                if tile * BL + BL > L:
                    r = tile * BL + gl.arange(0, BL, layout=gl.SliceLayout(1, gl.SliceLayout(2, vals_l)))
                    keep = (r < L)[:, None, None] & (o < 128)
                    x = gl.where(gl.convert_layout(keep, x.type.layout), x, 0.0)
            x = hadamard_rows(gl.reshape(x, [2 * BL, 64]), 2 * BL, 64, 6, 1.0)
            # The last level pairs (j, j + 64): the first half's lane keeps a + b, the second's a - b.
            x = gl.fma(gl.reshape(x, [BL, 2, 64]), sign, _partner_lane(gl.reshape(x, [BL, 2, 64])))
            words, scales = cast_packed(
                gl.reshape(x, [2 * BL, 2, 32]),
                NORM,
                CEIL,
                Q_EXP,
                Q_MANT,
                True,
                FOLD_E_MAX,
                _block_layout,
                _words_layout,
                _pack_words,
            )
            # The codes leave by TMA too: 64-byte rows in whole sectors, where each thread's two
            # 16-byte stores wrote every sector in halves.
            tma.store_wait(pendings=0)  # the previous tile's codes have left `out`
            out.reshape([BL, 2, 8]).store(gl.convert_layout(gl.reshape(words, [BL, 2, 8]), out_l))
            fence_async_shared()
            _cta_barrier()
            _tma_store(codes_desc, [b, h, tile * BL, 0], out)
            scales = gl.convert_layout(gl.reshape(scales, [BL, 2, 2]), scale_l).to(gl.uint8)
            gl.store(Scales + (bh.to(gl.int64) * L_PAD + tile * BL) * 4 + scale_offs, scales)
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(s))
        tma.store_wait(pendings=0)


_built: set[tuple] = set()  # (kernel name, dtype, constants) built in this process


@functools.cache
def _swizzled(swizzle: int, rank: int) -> object:
    """A 32-bit NVMMA shared layout of the Q^ pass's TMA boxes (built once, not per call)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=swizzle, element_bitwidth=32, rank=rank)


def _sm90_d128(x: torch.Tensor, hadamard: bool) -> bool:
    """A rotated, CUDA sm_90 x with D = 128 contiguous columns and 16-byte aligned rows (cp.async,
    TMA)."""
    return (
        HAS_GLUON
        and hadamard
        and x.is_cuda
        and x.shape[-1] == HEAD_DIM
        and x.stride(-1) == 1
        and x.data_ptr() % 16 == 0
        and all(s % 8 == 0 for s in x.stride()[:-1])
        and current_target(x.device) == SM_90A  # what Triton builds for (ROCm's MI200 says 9.0 too)
    )


def usable(x: torch.Tensor, lp: int, hadamard: bool) -> bool:
    """Whether `prepass_k_bf16` takes x [B, H, L, D] padded to lp rows: a CUDA sm_90 bf16 or fp16
    tensor with D = 128, rows that are 16-byte aligned (cp.async), lp a multiple of the tile, and
    the rotation on."""
    if x.dtype not in (torch.bfloat16, torch.float16) or lp % TILE_ROWS:
        return False
    return _sm90_d128(x, hadamard)


def usable_q(x: torch.Tensor, lp: int, hadamard: bool) -> bool:
    """Whether `prepass_q_packed` takes x [B, H, L, D] padded to lp rows: a CUDA sm_90 bf16 tensor
    with D = 128 whose rows TMA can copy (16-byte aligned base and strides), lp a multiple of its
    tile, and the rotation on."""
    if x.dtype != torch.bfloat16 or lp % (16 * Q_WARPS):
        return False
    return _sm90_d128(x, hadamard)


def _launch(
    name: str, kernel, grid: tuple, args: tuple, consts: dict, options: dict, dtype, slot=None
) -> None:
    """Launch a Gluon kernel (compile `options`: num_warps, maxnreg), built first without launching
    so that a build failure (Gluon's API and passes move between Triton releases) raises
    `specs.BuildFailure(name, why)` before anything runs; the planner records it and plans the `tl`
    pass (`builds.record`). `slot`: the launch's slot in a cached plan (`launch.launch`:
    built and launched once, then launched directly)."""
    if slot is None or slot[1] not in slot[0]:
        key = (name, dtype, tuple(sorted(consts.items())))
        if key not in _built:
            try:
                kernel.warmup(*args, grid=grid, **consts, **options)
            except Exception as err:  # any build error: the planner's fallback
                raise BuildFailure(name, f"{type(err).__name__}: {err}") from err
            _built.add(key)
    launch(kernel, grid, args, {**consts, **options}, slot)


def k_tiles(heads: int, lp: int, device: torch.device) -> tuple[int, int, int]:
    """(rows per tile, warps, programs) of the K^ pass over `heads` (B x H) heads of lp rows on
    `device`'s SMs: the large tiles where every program gets work, else the short-key tiles; as many programs
    as fill the SMs (`plan.plan_call` asks it per head chunk)."""
    sms = sm_count(device)
    rows, warps, per_sm = TILE_ROWS, WARPS, PROGRAMS_PER_SM
    if heads * (lp // rows) < per_sm * sms:
        rows, warps, per_sm = SMALL_TILE_ROWS, SMALL_WARPS, SMALL_PROGRAMS_PER_SM
    return rows, warps, min(heads * (lp // rows), per_sm * sms)


def q_tiles(heads: int, lp: int, device: torch.device) -> tuple[int, int, int]:
    """(rows per tile, warps, programs per head) of the Q^ pass over `heads` (B x H) heads of lp rows."""
    rows = 16 * Q_WARPS
    return rows, Q_WARPS, max(1, min(lp // rows, -(-Q_PROGRAMS_PER_SM * sm_count(device) // heads)))


def prepass_k_bf16(
    x: torch.Tensor,
    out: torch.Tensor,
    lp: int,
    rot_levels: int,
    rot_norm: float,
    rule_args: dict,
    tiles: tuple[int, int, int] | None = None,
    slot: tuple[dict, object] | None = None,
) -> None:
    """Rotated K^ of x [B, H, L, 128] as bf16 into out [B, H, lp, 128]; raises `specs.BuildFailure`
    (nothing written) if this Triton cannot build the kernel. `tiles`: the plan's `k_tiles`
    (default: asked here)."""
    b, h, n, d = x.shape
    rows, warps, programs = k_tiles(b * h, lp, x.device) if tiles is None else tiles
    tiles_per_head = lp // rows
    n_tiles = b * h * tiles_per_head
    grid = (programs,)
    args = (x, out, n, h, x.stride(0) // 8, x.stride(1) // 8, x.stride(2) // 8, lp, n_tiles, tiles_per_head)
    consts = dict(BL=rows, DP=d, STAGES=STAGES, ROT_LEVELS=rot_levels, ROT_NORM=rot_norm, **rule_args)
    _launch("k_bf16", _k_bf16_pipelined_kernel, grid, args, consts, dict(num_warps=warps), x.dtype, slot)


def prepass_q_packed(
    x: torch.Tensor,
    codes: torch.Tensor,
    scales: torch.Tensor,
    lp: int,
    rot_norm: float,
    fold_e_max: int,
    rule_args: dict,
    q_mean: tuple[torch.Tensor, int] | None = None,
    tiles: tuple[int, int, int] | None = None,
    slot: tuple[dict, object] | None = None,
) -> None:
    """Rotated, packed Q^ of bf16 x [B, H, L, 128] into codes [B, H, lp, 64] and scales
    [B, H, lp, 4] (uint8); raises `specs.BuildFailure` (nothing written) if this Triton cannot build it.
    `q_mean` = (qm [B, H, ceil(L / block), 128] fp32, block): Q smoothing, as `prepass.prepass_qk`.
    `tiles`: the plan's `q_tiles` (default: asked here)."""
    b, h, n, _ = x.shape
    rows, warps, per_head = q_tiles(b * h, lp, x.device) if tiles is None else tiles
    words = x.view(torch.int32).unflatten(-1, (2, 32))  # bf16 pairs, a half row per index of [2]
    layout = _swizzled(128, 5)
    desc = TensorDescriptor(words, list(words.shape), list(words.stride()), [1, 1, rows, 2, 32], layout)
    n_tiles = lp // rows
    code_words = codes.view(torch.int32)  # [B, H, lp, 16]
    out_layout = _swizzled(64, 4)
    codes_desc = TensorDescriptor(
        code_words, list(code_words.shape), list(code_words.stride()), [1, 1, rows, 16], out_layout
    )
    if q_mean is None:
        qm, block = scales, 0  # (QM is never read)
    else:
        qm, block = q_mean[0].contiguous(), q_mean[1]
        assert (
            block % rows == 0 and qm.shape == (b, h, -(-n // block), HEAD_DIM) and qm.dtype == torch.float32
        )
    args = (desc, codes_desc, scales, h, lp, n_tiles, qm, n, qm.shape[2] if block else 1)
    consts = dict(NORM=rot_norm, FOLD_E_MAX=fold_e_max, STAGES=Q_STAGES, SMOOTH=block, **rule_args)
    options = dict(num_warps=warps, maxnreg=Q_MAXNREG)
    _launch("q_packed", _q_packed_kernel, (per_head, b * h), args, consts, options, x.dtype, slot)
