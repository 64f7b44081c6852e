"""The public entry point: one function; the fused kernels where they apply, else the PyTorch reference.

Imports flow one way: this module sits above `attention` and `kernels`. Arguments are checked here,
once; the call itself is the custom op `mxattention::sdpa` (see `mxattention.kernels.op`), which
runs the fused Triton kernels for CUDA tensors (or CPU tensors under TRITON_INTERPRET=1 with
MXATTENTION_CPU_KERNELS=1) and a method they compute (MXFP4 / MXFP8 E4M3 operands, Q smoothing
included: `kernels.plan.plan_call`), and otherwise the reference, warning once per reason.
"""

from __future__ import annotations

import torch

from mxattention.attention.config import AttentionConfig, get_method
from mxattention.attention.inputs import check_mask, check_qkv, check_scalars
from mxattention.kernels.op import config_key, sdpa_op


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
    With `return_lse`, also the natural-log log-sum-exp [B, Hq, Lq] in fp32.
    """
    cfg = get_method(method)  # validates a preset name early
    shapes = check_qkv(query, key, value, enable_gqa)
    check_scalars(dropout_p, scale)
    check_mask(attn_mask, shapes, query, is_causal)
    scale_ = shapes.default_scale() if scale is None else float(scale)
    # A preset travels as its name: a plain string constant for torch.compile (torch 2.11's dynamo
    # cannot rebuild a frozen dataclass to call config_key on it).
    key_ = method if isinstance(method, str) else config_key(cfg)
    out, lse = sdpa_op(query, key, value, attn_mask, is_causal, scale_, enable_gqa, key_)
    return (out, lse) if return_lse else out
