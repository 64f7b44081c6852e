"""Pre-processing and fake quantization of the attention operands (the kernel pre-pass, in PyTorch).

Exposes `prepare_operands` (Q, K, V -> the values the GEMMs see) and `quantize_p` (the
exponential tile). Everything returned is float32; quantized values are exact in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mxattention.attention.config import AttentionConfig, QuantSpec
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
    if cfg.p_row_scale == 1.0:
        return quantize(p_tilde, cfg.p, -1)
    return quantize(p_tilde * cfg.p_row_scale, cfg.p, -1) / cfg.p_row_scale


@dataclass(frozen=True)
class Operands:
    q: torch.Tensor  # [B, H, Lq, D] float32, rotated / smoothed / quantized
    k: torch.Tensor  # [B, H, Lk, D]
    v: torch.Tensor  # [B, H, Lk, Dv]
    q_mean: torch.Tensor | None  # [B, H, Lq, D] per-token copy of the Sage block mean, or None
    k_smooth_t: torch.Tensor | None  # [B, H, D, Lk] unquantized smoothed K^T for qm K^T, or None


def prepare_operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cfg: AttentionConfig) -> Operands:
    """Rotate, smooth and quantize float32 Q [B,H,Lq,D], K [B,H,Lk,D], V [B,H,Lk,Dv] for `cfg`."""
    q_mean = None
    if cfg.smooth_k:
        k = k - k.mean(dim=-2, keepdim=True)  # softmax-invariant: shifts every score of a row equally
    if cfg.smooth_q:
        lq, blk = q.shape[-2], cfg.smooth_q_block
        nb = -(-lq // blk)
        pad = nb * blk - lq
        qp = torch.nn.functional.pad(q, (0, 0, 0, pad))
        counts = torch.full((nb,), float(blk), device=q.device)
        counts[-1] = blk - pad
        means = qp.unflatten(-2, (nb, blk)).sum(dim=-2) / counts[:, None]
        q_mean = means.repeat_interleave(blk, dim=-2)[..., :lq, :]
        q = q - q_mean
    if cfg.hadamard:
        q, k = rotate(q), rotate(k)
    k_smooth_t = k.transpose(-1, -2) if q_mean is not None else None
    return Operands(
        quantize(q, cfg.q, -1), quantize(k, cfg.k, -1), quantize(v, cfg.v, -2), q_mean, k_smooth_t
    )
