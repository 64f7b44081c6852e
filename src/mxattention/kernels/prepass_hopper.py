"""The rotated K^ pass on Hopper: a persistent Gluon kernel with a cp.async pipeline (bf16 output).

Computes exactly `prepass._qk_prepass_kernel` with OUT_BF16 (the Hopper attention path's K^): the
same `hadamard_rows` and `cast_blocks`, on one row per thread, so the bytes are identical (GPU test
`tests/kernels/test_gpu.py`). What differs is the data movement, which Triton's automatic layouts
could not get right for this pass (benchmarks/NOTES.md, v6a and v7):

- each program owns a strided set of [BL, 128] row tiles and copies tile i + 1 into shared memory
  (cp.async, coalesced 16-byte chunks) while it rotates and casts tile i, so the memory system
  stays busy through the ~30 instructions per element of arithmetic;
- the tile is read from shared memory straight into the row-per-thread layout (swizzled rows:
  conflict-free), and the bf16 result goes back through shared memory to coalesced stores.

Measured on the H200: 74-77 % of the copy bandwidth against 65-68 % for the `tl` kernel's tile
layout. The packed Q^ pass does not gain from the same pipeline (its output is small, its loop
instruction-bound), so it stays on the `tl` kernel. Used by `prepass.prepass_qk` on sm_90 only (where
it was measured), for head dim 128 and row counts that are a multiple of 128; Gluon is Triton's
experimental layer, so a Triton that cannot build it falls back to the `tl` kernel with one warning.
"""

from __future__ import annotations

import warnings

import torch

from mxattention.kernels._triton import triton
from mxattention.kernels.cast import cast_blocks
from mxattention.kernels.hadamard import hadamard_rows

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy

    # Renamed after Triton 3.6 (the old names are gone or raise); same arguments.
    _async_load = getattr(async_copy, "async_load", None) or async_copy.async_copy_global_to_shared
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    HAS_GLUON = True
except (ImportError, AttributeError):  # no Triton, or one without Gluon's cp.async
    HAS_GLUON = False

# (rows per tile, warps, pipeline stages, programs per SM); H200 sweep (benchmarks/results/raw/
# prepass_gluon_pipe_v7_h200.json): 2 programs of 4 warps (188 registers per thread) fill an SM.
TILE_ROWS, WARPS, STAGES, PROGRAMS_PER_SM = 128, 4, 2, 2
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
            _, _, vals = cast_blocks(gl.reshape(x, [BL, DP // 32, 32]), CEIL, Q_EXP, Q_MANT, 2)
            out = gl.convert_layout(gl.reshape(vals, [BL, DP]).to(gl.bfloat16), io)
            bh = t // tiles_per_head
            out_rows = bh.to(gl.int64) * L_PAD + ((t - bh * tiles_per_head) * BL + rows[:, None]).to(gl.int64)
            gl.store(Out + out_rows * DP + cols[None, :], out)
        async_copy.wait_group(0)


_broken: list[str] = []  # the reason, once a build failed in this process
_built: set[tuple] = set()  # (dtype, constants) built in this process


def usable(x: torch.Tensor, lp: int, hadamard: bool) -> bool:
    """Whether `prepass_k_bf16` takes x [B, H, L, D] padded to lp rows: a CUDA sm_90 tensor with
    D = 128, rows that are 16-byte aligned (cp.async), lp a multiple of the tile, and the rotation on."""
    if not (
        HAS_GLUON and hadamard and not _broken and x.is_cuda and x.dtype in (torch.bfloat16, torch.float16)
    ):
        return False
    if x.shape[-1] != HEAD_DIM or lp % TILE_ROWS or torch.cuda.get_device_capability(x.device) != (9, 0):
        return False
    return x.stride(-1) == 1 and x.data_ptr() % 16 == 0 and all(s % 8 == 0 for s in x.stride()[:-1])


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def prepass_k_bf16(
    x: torch.Tensor, out: torch.Tensor, lp: int, rot_levels: int, rot_norm: float, rule_args: dict
) -> bool:
    """Rotated K^ of x [B, H, L, 128] as bf16 into out [B, H, lp, 128]; False (nothing written) if
    this Triton cannot build the kernel, after one warning that says why."""
    b, h, n, d = x.shape
    tiles_per_head = lp // TILE_ROWS
    n_tiles = b * h * tiles_per_head
    grid = (min(n_tiles, PROGRAMS_PER_SM * _sm_count(x.device)),)
    args = (x, out, n, h, x.stride(0) // 8, x.stride(1) // 8, x.stride(2) // 8, lp, n_tiles, tiles_per_head)
    consts = dict(BL=TILE_ROWS, DP=d, STAGES=STAGES, ROT_LEVELS=rot_levels, ROT_NORM=rot_norm, **rule_args)
    key = (x.dtype, tuple(sorted(consts.items())))
    if key not in _built:
        # Build without launching, so that only a build failure (Gluon's API and passes move
        # between Triton releases) falls back; nothing has run on the GPU yet.
        try:
            _k_bf16_pipelined_kernel.warmup(*args, grid=grid, **consts, num_warps=WARPS)
        except Exception as err:  # any build error: reported once, then the tl kernel
            _broken.append(f"{type(err).__name__}: {err}")
            warnings.warn(
                f"mxattention: the Gluon K^ pre-pass does not build with Triton {triton.__version__} "
                f"({_broken[0][:300]}); using the tl kernel (same bytes, ~10 % slower pass)",
                RuntimeWarning,
                stacklevel=3,
            )
            return False
        _built.add(key)
    _k_bf16_pipelined_kernel[grid](*args, **consts, num_warps=WARPS)
    return True
