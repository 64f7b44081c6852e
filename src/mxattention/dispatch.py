"""The public entry point: one function that picks the fused kernel or the PyTorch reference.

Imports flow one way: this module sits above `attention` and `kernels`.
"""

from __future__ import annotations

import torch

from mxattention.attention.config import AttentionConfig
from mxattention.attention.sdpa import sdpa_reference


def scaled_dot_product_attention(
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
    """Drop-in for `torch.nn.functional.scaled_dot_product_attention` with 4-bit MX attention.

    Layout [B, H, L, D]; see `mxattention.attention.sdpa_reference` for the full semantics.
    `method` is a preset name (`mxattention.list_methods()`) or an `AttentionConfig`.
    """
    return sdpa_reference(
        query,
        key,
        value,
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        method=method,
        return_lse=return_lse,
    )
