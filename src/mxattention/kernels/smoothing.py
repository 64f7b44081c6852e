"""Q smoothing's correction for the attention kernel: qm K^T per query block and key, on tensor cores.

Exposes `smoothing_correction`, `correction_parts` (how many bf16 parts an fp32 value and a
key element take), `CorrTiles` / `corr_tiles` (a launch's tiles). docs/design.md, 'Precision
ladder and smoothing'.

Every product is exact: qm (fp32, 24 significant bits) is split into three bf16 parts h1 + h2 + h3
= qm exactly (each part the bf16 of what the earlier ones left, whatever the cast's rounding; the
remainders are exact fp32 subtractions); a bf16 key is one bf16 part, an fp16 key two (11 bits),
an fp32 key three. A product of two parts has <= 16 significant bits, exact in fp32; the dots
accumulate them in fp32, the smallest parts first. So the correction differs from the
reference's fp32 dot (D rounded products, summed in the BLAS's order) only by the order and
rounding of fp32 additions, as the kernel's Q^ K^ scores do.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mxattention.kernels._triton import kernels_interpreted, tl, triton
from mxattention.kernels.launch import launch
from mxattention.kernels.prepass import padded_dim

# Key elements per bf16 part count: bf16 is exact in one, fp16 (11 significant bits) in two.
_KEY_PARTS = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3}


def correction_parts(dtype: torch.dtype) -> int:
    """bf16 parts that hold a key element of `dtype` exactly (qm always takes 3)."""
    return _KEY_PARTS[dtype]


@triton.jit
def _split3(x, DOT_T: tl.constexpr):
    """x (fp32) = a + b + c exactly, each part a bf16 value (held as DOT_T)."""
    a = x.to(tl.bfloat16).to(tl.float32)
    r = x - a
    b = r.to(tl.bfloat16).to(tl.float32)
    c = r - b
    return a.to(DOT_T), b.to(DOT_T), c.to(DOT_T)


@triton.jit
def _corr_tile(
    q1, q2, q3, K, keys, cols, Lk, D, stride_kl, stride_kd, KPARTS: tl.constexpr, DOT_T: tl.constexpr
):
    """qm . k_j (fp32 [BNB, BK]) for the keys j of one tile (K at the head's keys), every product
    exact, summed in this fixed order of dots."""
    k = tl.load(
        K + keys[:, None].to(tl.int64) * stride_kl + cols[None, :] * stride_kd,
        mask=(keys[:, None] < Lk) & (cols[None, :] < D),
        other=0.0,
    )
    if KPARTS == 1:
        k1 = tl.trans(k.to(tl.bfloat16).to(DOT_T))  # exact for bf16 keys (the interpreter dots in fp32)
        acc = tl.dot(q3, k1)
        acc = tl.dot(q2, k1, acc)
        acc = tl.dot(q1, k1, acc)
    else:
        k1, k2, k3 = _split3(k.to(tl.float32), DOT_T)  # fp16: k3 = 0
        k1, k2 = tl.trans(k1), tl.trans(k2)
        acc = tl.dot(q3, k2)  # products from the smallest (2**-24 of the largest) up
        if KPARTS == 3:
            k3 = tl.trans(k3)
            acc = tl.dot(q3, k3, acc)
            acc = tl.dot(q2, k3, acc)
            acc = tl.dot(q1, k3, acc)
        acc = tl.dot(q2, k2, acc)
        acc = tl.dot(q3, k1, acc)
        acc = tl.dot(q1, k2, acc)
        acc = tl.dot(q2, k1, acc)
        acc = tl.dot(q1, k1, acc)
    return acc


@triton.jit
def _corr_kernel(
    QM, K, Corr, NB, Lk, D, H, GROUP, LKP, stride_kb, stride_kh, stride_kl, stride_kd,
    BNB: tl.constexpr, BK: tl.constexpr, KT: tl.constexpr, DP: tl.constexpr, KPARTS: tl.constexpr,
    DOT_T: tl.constexpr,
):  # fmt: skip
    """Corr[bh, i, j] = qm_i . k_j for the query blocks i of program_id(1)'s BNB rows and the keys j
    of program_id(0)'s KT tiles of BK; keys in [Lk, LKP) get 0. qm's parts are split once per
    program, each tile's value is `_corr_tile`'s: the same bits whatever the launch's shape."""
    bh = tl.program_id(2)
    blocks = tl.program_id(1) * BNB + tl.arange(0, BNB)
    cols = tl.arange(0, DP)
    qm = tl.load(
        QM + (bh.to(tl.int64) * NB + blocks[:, None]) * D + cols[None, :],
        mask=(blocks[:, None] < NB) & (cols[None, :] < D),
        other=0.0,
    )
    q1, q2, q3 = _split3(qm, DOT_T)
    kh = K + (bh // H).to(tl.int64) * stride_kb + ((bh % H) // GROUP).to(tl.int64) * stride_kh
    out = Corr + (bh.to(tl.int64) * NB + blocks[:, None]) * LKP
    ok = blocks[:, None] < NB
    # qm's parts stay in registers / shared memory while the key tiles stream through the pipeline.
    first = tl.program_id(0) * KT
    for t in range(first, tl.minimum(first + KT, tl.cdiv(LKP, BK))):
        keys = t * BK + tl.arange(0, BK)
        acc = _corr_tile(q1, q2, q3, kh, keys, cols, Lk, D, stride_kl, stride_kd, KPARTS, DOT_T)
        tl.store(out + keys[None, :], acc, mask=ok & (keys[None, :] < LKP))


@dataclass(frozen=True)
class CorrTiles:
    """One correction launch's tiles: `blocks` query blocks per tile (an MMA's rows, 16 to 128),
    `keys` per tile, `key_tiles` tiles per program (qm split once for them), `warps`, `stages`."""

    blocks: int
    keys: int
    key_tiles: int
    warps: int
    stages: int


def corr_tiles(nb: int) -> CorrTiles:
    """The tiles of a correction with nb query blocks (a function of nb only, so that every head or
    batch chunk of a call takes the same tiles, whatever its keys or their dtype): 16 to 64 blocks (an MMA's rows) x 64 keys, 8 key tiles per program (16 from 256 blocks up), 4 warps,
    3 stages. H200 sweep (benchmarks/results/smooth_gluon_h200.md, v14): per 16k chunk 0.098 ms
    against 0.127 for one tile of 128 keys per program (a fresh qm split per tile), 75k 0.203 / 0.267."""
    blocks = min(64, max(16, triton.next_power_of_2(max(1, nb))))
    return CorrTiles(blocks, 64, 16 if nb >= 256 else 8, 4, 3)


def smoothing_correction(
    qm: torch.Tensor,
    k: torch.Tensor,
    lkp: int,
    *,
    tiles: CorrTiles | None = None,
    slot: tuple[dict, object] | None = None,
) -> torch.Tensor:
    """Q smoothing's per-block correction, fp32 [B, Hq, nb, lkp] = qm [B, Hq, nb, D] (fp32) .
    k [B, Hkv, Lk, D] (bf16, fp16 or fp32; GQA: each query head's KV head), unscaled, zero past Lk.
    The same bits for any batch or head chunk (`fused.fused_attention` splits by memory) and, on
    CUDA, any `tiles` (default `corr_tiles`, which depend on nb only): each value is one fixed
    sequence of k16 MMA steps over D (the CPU interpreter's numpy dot keeps its order only for a
    fixed tile shape). `slot`: the launch's slot in a cached plan (`launch.launch`)."""
    b, hq, nb, d = qm.shape
    hk, lk = k.shape[1], k.shape[2]
    corr = torch.empty((b, hq, nb, lkp), dtype=torch.float32, device=qm.device)
    kparts = correction_parts(k.dtype)
    t = corr_tiles(nb) if tiles is None else tiles
    grid = (-(-lkp // (t.keys * t.key_tiles)), -(-nb // t.blocks), b * hq)
    # The interpreter's bf16 dot is wrong (Triton 3.9); the parts are exact in fp32 too, so it
    # multiplies them in fp32 (products exact either way).
    dot_t = tl.float32 if kernels_interpreted() else tl.bfloat16
    args = (qm.contiguous(), k, corr, nb, lk, d, hq, hq // hk, lkp, *k.stride())
    consts = dict(BNB=t.blocks, BK=t.keys, KT=t.key_tiles, DP=padded_dim(d), KPARTS=kparts, DOT_T=dot_t,
                  num_warps=t.warps, num_stages=t.stages)  # fmt: skip
    launch(_corr_kernel, grid, args, consts, slot)
    return corr
