"""`sdpa_reference`: torch SDPA's signature and semantics on top of the PyTorch reference."""

from __future__ import annotations

import torch

from mxattention.attention.config import AttentionConfig, get_method
from mxattention.attention.inputs import check_mask, check_qkv, check_scalars
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
    shapes = check_qkv(query, key, value, enable_gqa)
    check_scalars(dropout_p, scale)
    mask = check_mask(attn_mask, shapes, query, is_causal)
    scale_ = shapes.default_scale() if scale is None else float(scale)
    k, v = key.float(), value.float()
    if shapes.q_heads != shapes.kv_heads:
        group = shapes.q_heads // shapes.kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    out, lse = reference_attention(query.float(), k, v, cfg, mask=mask, is_causal=is_causal, scale=scale_)
    out = cast_output(out, query.dtype)
    return (out, lse) if return_lse else out
