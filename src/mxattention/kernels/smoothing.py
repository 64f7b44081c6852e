"""Q smoothing's correction for the attention kernel: qm K^T per query block and key, on tensor cores.

Exposes `smoothing_correction` and `correction_parts` (how many bf16 parts an fp32 value and a
key element take). docs/design.md, 'Precision ladder and smoothing'.

Every product is exact: qm (fp32, 24 significant bits) is split into three bf16 parts h1 + h2 + h3
= qm exactly (each part the bf16 of what the earlier ones left, whatever the cast's rounding; the
remainders are exact fp32 subtractions); a bf16 key is one bf16 part, an fp16 key two (11 bits),
an fp32 key three. A product of two parts has <= 16 significant bits, exact in fp32; the dots
accumulate them in fp32, the smallest parts first. So the correction differs from the
reference's fp32 dot (D rounded products, summed in the BLAS's order) only by the order and
rounding of fp32 additions, as the kernel's Q^ K^ scores do.
"""

from __future__ import annotations

import torch

from mxattention.kernels._triton import kernels_interpreted, tl, triton
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
def _corr_kernel(
    QM, K, Corr, NB, Lk, D, H, GROUP, LKP, stride_kb, stride_kh, stride_kl, stride_kd,
    BNB: tl.constexpr, BK: tl.constexpr, DP: tl.constexpr, KPARTS: tl.constexpr, DOT_T: tl.constexpr,
):  # fmt: skip
    """Corr[bh, i, j] = qm_i . k_j for the query blocks i of program_id(1)'s rows and keys j of
    program_id(0)'s; keys in [Lk, LKP) get 0. The same bits whatever else the launch holds."""
    bh = tl.program_id(2)
    blocks = tl.program_id(1) * BNB + tl.arange(0, BNB)
    keys = tl.program_id(0) * BK + tl.arange(0, BK)
    cols = tl.arange(0, DP)
    qm = tl.load(
        QM + (bh.to(tl.int64) * NB + blocks[:, None]) * D + cols[None, :],
        mask=(blocks[:, None] < NB) & (cols[None, :] < D),
        other=0.0,
    )
    q1, q2, q3 = _split3(qm, DOT_T)
    kb = (bh // H).to(tl.int64) * stride_kb + ((bh % H) // GROUP).to(tl.int64) * stride_kh
    k = tl.load(
        K + kb + keys[:, None].to(tl.int64) * stride_kl + cols[None, :] * stride_kd,
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
    ptrs = Corr + (bh.to(tl.int64) * NB + blocks[:, None]) * LKP + keys[None, :]
    tl.store(ptrs, acc, mask=(blocks[:, None] < NB) & (keys[None, :] < LKP))


def smoothing_correction(qm: torch.Tensor, k: torch.Tensor, lkp: int) -> torch.Tensor:
    """Q smoothing's per-block correction, fp32 [B, Hq, nb, lkp] = qm [B, Hq, nb, D] (fp32) .
    k [B, Hkv, Lk, D] (bf16, fp16 or fp32; GQA: each query head's KV head), unscaled, zero past Lk.
    The same bits for any batch or head chunk (`fused.fused_attention` splits by memory): each
    value is one fixed tile dot."""
    b, hq, nb, d = qm.shape
    hk, lk = k.shape[1], k.shape[2]
    corr = torch.empty((b, hq, nb, lkp), dtype=torch.float32, device=qm.device)
    kparts = correction_parts(k.dtype)
    # 16 to 64 query blocks per tile (an MMA's rows); three key parts keep the operands in shared
    # memory with 64 keys.
    bnb = min(64, max(16, triton.next_power_of_2(max(1, nb))))
    bk = 128 if kparts == 1 else 64
    grid = (-(-lkp // bk), -(-nb // bnb), b * hq)
    # The interpreter's bf16 dot is wrong (Triton 3.9); the parts are exact in fp32 too, so it
    # multiplies them in fp32 (products exact either way).
    dot_t = tl.float32 if kernels_interpreted() else tl.bfloat16
    _corr_kernel[grid](
        qm.contiguous(), k, corr, nb, lk, d, hq, hq // hk, lkp, *k.stride(),
        BNB=bnb, BK=bk, DP=padded_dim(d), KPARTS=kparts, DOT_T=dot_t, num_warps=4,
    )  # fmt: skip
    return corr
