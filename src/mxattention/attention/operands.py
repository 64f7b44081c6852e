"""Pre-processing and fake quantization of the attention operands (the kernel pre-pass, in PyTorch).

Exposes `prepare_operands` (Q, K, V -> the values the GEMMs see) and `quantize_p` (the
exponential tile). Everything returned is float32; quantized values are exact in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mxattention.attention.config import AttentionConfig, QuantSpec
from mxattention.attention.fast import fold_operands, fold_p_values
from mxattention.formats.fold import P_MIN_EXP
from mxattention.formats.mx import fake_quantize
from mxattention.formats.nvfp4 import nvfp4_fake_quantize
from mxattention.rotation import rotate


def quantize(x: torch.Tensor, spec: QuantSpec | None, axis: int) -> torch.Tensor:
    """Fake-quantize float32 `x` along `axis` as `spec` says (identity for None)."""
    if spec is None:
        return x
    if spec.is_mx:
        return fake_quantize(x, axis, rule=spec.rule, elem=spec.elem)
    return nvfp4_fake_quantize(x, axis, two_level=spec.two_level)


def quantize_p(p_tilde: torch.Tensor, cfg: AttentionConfig) -> torch.Tensor:
    """Q(P~) along the keys (last axis) in float32; `p_row_scale` is applied and undone around it."""
    if cfg.p is None:
        return p_tilde
    if cfg.mma == "fp8":  # the fast mode: the tile the FP8 P~V product consumes (`attention.fast`)
        return fold_p_values(fake_quantize(p_tilde, -1, rule=cfg.p.rule, elem=cfg.p.elem, min_exp=P_MIN_EXP))
    if cfg.p_row_scale == 1.0:
        return quantize(p_tilde, cfg.p, -1)
    return quantize(p_tilde * cfg.p_row_scale, cfg.p, -1) / cfg.p_row_scale


@dataclass(frozen=True)
class Operands:
    q: torch.Tensor  # [B, H, Lq, D] float32, smoothed / rotated / quantized
    k: torch.Tensor  # [B, H, Lk, D]
    v: torch.Tensor  # [B, H, Lk, Dv]
    q_mean: torch.Tensor | None  # [B, H, Lq, D] per-token copy of the Q block mean (unrotated), or None
    k_smooth_t: torch.Tensor | None  # [B, H, D, Lk] smoothed K^T, unrotated and unquantized, or None
    k_mean: torch.Tensor | None  # [B, H, 1, D] the token mean K smoothing took off, or None


def q_block_mean_rows(q: torch.Tensor, block: int) -> torch.Tensor:
    """The fp32 mean [..., ceil(Lq / block), D] of each block of `block` query tokens (the last
    ragged) of a float `q` of any dtype; the fused kernels take these very values (`kernels.fused`).

    Summed in fp32 without an fp32 copy of `q` (on CUDA a bf16 / fp16 sum with dtype=float32 widens
    each element as it is read; every such element is exact in fp32): the output is the only buffer.
    A `block` >= Lq is one block of all Lq queries, the same bits as block = Lq. A mean that is not
    finite (a NaN / Inf of `q` in that channel and block, or a sum past fp32's range) is 0: that
    channel of that block is not smoothed, so the bad value stays in its own row (docs/design.md,
    'Special values and overflow'); smoothing is exact for any finite mean.
    """
    lq = q.shape[-2]
    block = max(1, min(block, lq))
    full = lq // block
    parts = []
    if full:
        sums = q[..., : full * block, :].unflatten(-2, (full, block)).sum(dim=-2, dtype=torch.float32)
        parts.append(sums / block)
    if lq % block:
        tail = q[..., full * block :, :].sum(dim=-2, keepdim=True, dtype=torch.float32)
        parts.append(tail / (lq % block))
    if not parts:  # no queries, no blocks
        return q.new_zeros((*q.shape[:-2], 0, q.shape[-1]), dtype=torch.float32)
    means = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-2)
    return means.nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)


def q_block_means(q: torch.Tensor, block: int) -> torch.Tensor:
    """Per-token copy [..., Lq, D] of the mean of each block of `block` query tokens (the last ragged);
    O(Lq) memory whatever `block` (a row index per token, never `block` rows per mean)."""
    lq = q.shape[-2]
    rows = torch.arange(lq, device=q.device) // max(1, min(block, lq))
    return q_block_mean_rows(q, block).index_select(-2, rows)


def prepare_operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: AttentionConfig) -> Operands:
    """Smooth, rotate and quantize float32 Q [B,H,Lq,D], K [B,H,Lk,D], V [B,H,Lk,Dv] for `cfg`.

    Smoothing comes first, on the original basis (docs/design.md, 'Precision ladder and smoothing'):
    the rotation would turn a common offset into one large coordinate (H 1 = sqrt(d) e_1), and the
    correction qm K^T must pair qm with K on the basis qm was taken in.
    """
    q_mean = k_mean = k_smooth_t = None
    if cfg.smooth_k:
        k_mean = k.mean(dim=-2, keepdim=True)
        k = k - k_mean  # shifts every score of a row by q . k_mean: softmax-invariant
    if cfg.smooth_q:
        q_mean = q_block_means(q, cfg.smooth_q_block)
        q = q - q_mean
        k_smooth_t = k.transpose(-1, -2)
    if cfg.hadamard and q.shape[-1]:  # an empty head dim has nothing to rotate
        q, k = rotate(q), rotate(k)
    q, k, v = quantize(q, cfg.q, -1), quantize(k, cfg.k, -1), quantize(v, cfg.v, -2)
    if cfg.mma == "fp8":  # the fast mode: the values FP8 tensor cores consume (`attention.fast`)
        q, k, v = fold_operands(q, k, v)
    return Operands(q, k, v, q_mean, k_smooth_t, k_mean)
