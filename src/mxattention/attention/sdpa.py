"""`sdpa_reference`: torch SDPA's signature and semantics on top of the PyTorch reference.

Exposes `sdpa_reference` (the arguments checked by `attention.inputs.check_sdpa`) and
`checked_sdpa_reference` (the same on arguments checked by the caller: the custom op's fallback,
whose public entry point checked them once).
"""

from __future__ import annotations

import torch

from mxattention.attention.config import AttentionConfig, get_method
from mxattention.attention.inputs import check_sdpa
from mxattention.attention.reference import cast_output, reference_attention


def sdpa_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    method: str | AttentionConfig = "mxattention",
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Quantized attention with `torch.nn.functional.scaled_dot_product_attention`'s arguments.

    query [B, Hq, Lq, D], key [B, Hkv, Lk, D], value [B, Hkv, Lk, Dv]; fp32 / fp16 / bf16.
    `attn_mask`: bool (True = attend) or additive float, broadcastable to [B, Hq, Lq, Lk].
    `is_causal`: key j attends to query i iff j <= i (top-left, as torch). Returns O
    [B, Hq, Lq, Dv] in the input dtype, and with `return_lse` also the natural-log log-sum-exp
    [B, Hq, Lq] (fp32) of the weights actually used. Rows with no key to attend give O = 0 and
    lse = -inf (torch gives NaN there).
    """
    cfg = get_method(method)
    scale_ = check_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    b, hq, lq, _ = query.shape
    mask = None if attn_mask is None else attn_mask.expand(b, hq, lq, key.shape[2])
    out, lse = checked_sdpa_reference(query, key, value, mask, is_causal, scale_, cfg)
    return (out, lse) if return_lse else out


def checked_sdpa_reference(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
    cfg: AttentionConfig,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O in query's dtype, lse fp32) of `sdpa_reference` on checked arguments: `mask` None or a
    [B, Hq, Lq, Lk] view, `scale` a float, Hq a multiple of Hkv."""
    k, v = key.float(), value.float()
    hq, hk = query.shape[1], key.shape[1]
    if hq != hk:
        group = hq // hk
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out, lse = reference_attention(query.float(), k, v, cfg, mask=mask, is_causal=is_causal, scale=scale)
    return cast_output(out, query.dtype), lse
