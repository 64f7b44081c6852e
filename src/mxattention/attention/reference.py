"""The tiled online-softmax attention of the paper (Algorithm 1), in PyTorch: the specification.

Exposes `reference_attention`, `cast_output` (the saturating cast to the input dtype) and
`flush_subnormals` (the softmax's exps are 0 below 2**-126, on every device, as in the kernels).
For each key tile j of `block_n` keys (FlashAttention-2 form, fp32 state, names as in
docs/design.md, 'Attention algorithm'):

    S      = Q^ K^_j^T * scale  (+ mask)           m_new = max(m, rowmax S)
    alpha  = exp(m - m_new)                         P~    = exp(S - m_new)   (both 0 below 2**-126)
    P^     = Q(P~) per 32 keys                      l     = alpha l + rowsum(P^ if pnq else P~)
    O~     = alpha O~ + P^ V^_j                     finally O = O~ / l, lse = m + log l

With Q smoothing S adds qm K_s_j^T * scale in fp32 (qm the query block's mean, K_s the smoothed,
unrotated, unquantized keys); with K smoothing lse adds back q . mean(K) * scale, so it is the lse
of the caller's scores whatever mean was taken off.

Memory: the scores of one tile of [B, H, rows, block_n] are alive at a time, with `rows` chosen
so that tile holds at most `max_tile_elements` values; rows are independent, so the result does
not depend on that choice. The state is O(Lq * Dv). No Lq x Lk matrix is ever formed.
"""

from __future__ import annotations

import torch

from mxattention.attention.config import AttentionConfig
from mxattention.attention.operands import Operands, prepare_operands, quantize_p

MAX_TILE_ELEMENTS = 1 << 24  # 64 MiB of fp32 scores per tile
FP32_TINY = 2.0**-126  # fp32's smallest normal: the softmax's exps below it are 0 (`flush_subnormals`)


def _causal_tile(q0: int, q1: int, k0: int, k1: int, device: torch.device) -> torch.Tensor:
    """bool [q1-q0, k1-k0], True where key <= query (torch SDPA's top-left causal alignment)."""
    qi = torch.arange(q0, q1, device=device)[:, None]
    ki = torch.arange(k0, k1, device=device)[None, :]
    return ki <= qi


def _rows(
    ops: Operands,
    q0: int,
    q1: int,
    mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
    cfg: AttentionConfig,
):
    """Online softmax over all key tiles for query rows [q0, q1): (O~, l, m) in fp32."""
    q = ops.q[..., q0:q1, :]
    b, h, rows, _ = q.shape
    lk, dv = ops.k.shape[-2], ops.v.shape[-1]
    dev = q.device
    m = torch.full((b, h, rows, 1), -float("inf"), device=dev)
    l = torch.zeros((b, h, rows, 1), device=dev)
    o = torch.zeros((b, h, rows, dv), device=dev)
    kt = ops.k.transpose(-1, -2)
    for k0 in range(0, lk, cfg.block_n):
        k1 = min(k0 + cfg.block_n, lk)
        if is_causal and k0 > q1 - 1:
            break  # every later key is in the future of every row here
        s = (q @ kt[..., k0:k1]) * scale
        if ops.q_mean is not None:
            s = s + (ops.q_mean[..., q0:q1, :] @ ops.k_smooth_t[..., k0:k1]) * scale
        if mask is not None:
            mt = mask[..., q0:q1, k0:k1]
            s = s.masked_fill(~mt, -float("inf")) if mt.dtype == torch.bool else s + mt.float()
        if is_causal:
            s = s.masked_fill(~_causal_tile(q0, q1, k0, k1, dev), -float("inf"))
        m_new = torch.maximum(m, s.amax(dim=-1, keepdim=True))
        # A row with every key so far masked keeps m = -inf; exp(-inf - 0) = 0 keeps it empty.
        m_use = torch.where(torch.isneginf(m_new), torch.zeros_like(m_new), m_new)
        alpha = flush_subnormals(torch.exp(m - m_use))
        p_tilde = flush_subnormals(torch.exp(s - m_use))
        p_hat = quantize_p(p_tilde, cfg)
        l = alpha * l + (p_hat if cfg.pnq else p_tilde).sum(dim=-1, keepdim=True)
        o = alpha * o + p_hat @ ops.v[..., k0:k1, :]
        m = m_new
    return o, l, m


def flush_subnormals(x: torch.Tensor) -> torch.Tensor:
    """fp32 x with values below 2**-126 (fp32's smallest normal) set to 0, NaN kept: the softmax's
    exp flushes its subnormal results, as NVIDIA GPUs' exp2 (`ex2.approx.ftz.f32`) does in the
    kernels (docs/design.md, 'Special values and overflow'). For x >= 0 or NaN (exps)."""
    return x.masked_fill(x < FP32_TINY, 0.0)


def cast_output(out: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The fp32 attention output `out` in `dtype`, finite values saturated at dtype's largest finite value.

    The exact output is a convex combination of rows of V, so it lies in the input dtype's range;
    the quantized one can pass it by one quantization step (fp16 65504 is the MXFP4 value 65536
    under UOS / TFS), which a rounding cast would make Inf. Clamping only moves such a value
    towards the exact answer. NaN stays NaN (docs/design.md, 'Special values and overflow').
    """
    if out.dtype == dtype:
        return out
    big = torch.finfo(dtype).max
    if torch.finfo(out.dtype).max > big:
        out = out.clamp(-big, big)
    return out.to(dtype)


def reference_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cfg: AttentionConfig,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float,
    max_tile_elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of float32 [B, H, L, D] operands (heads already matched) as `cfg` says.

    `mask`: None, or bool (True = attend) / float additive, a view broadcast to [B, H, Lq, Lk].
    Returns (O [B, H, Lq, Dv] float32, lse [B, H, Lq] float32, natural log; -inf and O = 0 for
    rows with no key to attend to).
    """
    b, h, lq, _ = query.shape
    if lq == 0:
        return query.new_zeros((b, h, 0, value.shape[-1])), query.new_zeros((b, h, 0))
    ops = prepare_operands(query, key, value, cfg)
    budget = MAX_TILE_ELEMENTS if max_tile_elements is None else max_tile_elements
    rows = max(1, min(lq, budget // max(1, b * h * cfg.block_n)))
    outs, lses = [], []
    for q0 in range(0, lq, rows):
        q1 = min(q0 + rows, lq)
        o, l, m = _rows(ops, q0, q1, mask, is_causal, scale, cfg)
        empty = l == 0
        outs.append(torch.where(empty, torch.zeros_like(o), o / torch.where(empty, 1.0, l)))
        lses.append(torch.where(empty, -float("inf"), m + torch.log(torch.where(empty, 1.0, l))).squeeze(-1))
    lse = torch.cat(lses, dim=-1)
    if ops.k_mean is not None and key.shape[-2]:  # (no keys: no mean, and lse stays -inf)
        # K smoothing took q . k_mean * scale off every score of a row; the lse of the scores the
        # caller gave (what a merge of key chunks with different means needs) adds it back.
        lse = lse + ((query @ ops.k_mean.transpose(-1, -2)).squeeze(-1) * scale)
    return torch.cat(outs, dim=-2), lse
