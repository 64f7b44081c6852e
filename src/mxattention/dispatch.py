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

    query [B, Hq, Lq, D], key [B, Hkv, Lk, D], value [B, Hkv, Lk, Dv]: one dtype among fp32, fp16,
    bf16, on one device; Hq != Hkv needs `enable_gqa=True` and Hq a multiple of Hkv. `attn_mask`:
    bool (True = attend) or additive float, broadcastable to [B, Hq, Lq, Lk], not with `is_causal`
    (top-left, as torch). `scale` defaults to 1 / sqrt(D). `method`: a preset name
    (`mxattention.list_methods()`) or an `AttentionConfig` (docs/presets.md). Returns O
    [B, Hq, Lq, Dv] in query's dtype and, with `return_lse`, also the natural-log log-sum-exp
    [B, Hq, Lq] fp32. A row with no key to attend gives O = 0 and lse = -inf (torch gives NaN).

    Where it runs: CUDA tensors of a method the fused kernels compute (MXFP4 / MXFP8 E4M3 operands,
    Q and K in one format, head dim <= 256, Triton installed) run the Triton kernels: the Hopper
    kernels on sm_90 (tested on the H200); `tl.dot_scaled` with native MX instructions on sm_100 /
    sm_120 / gfx950 (built offline, not run on such GPUs); the portable Triton kernel on other CUDA
    GPUs (not tested there). Every other call (CPU tensors, `fp`, NVFP4 presets, K smoothing, ...)
    runs the PyTorch reference, which computes the same function, with a `ReferenceFallbackWarning`
    once per reason (docs/performance.md). The call is the custom op `mxattention::sdpa`:
    one opaque node under torch.compile, with the same choice made at run time.

    Raises TypeError (a non-tensor, another dtype, a mask of another dtype, `scale` not a number,
    `method` neither a str nor an AttentionConfig) or ValueError (inputs not 4-D, shapes that
    disagree, devices that differ, a mask that does not broadcast, is on another device or comes
    with `is_causal`, `dropout_p` != 0, an unknown preset), each naming the argument. Inference
    only: a backward pass through the result raises `mxattention.InferenceOnlyError`.
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
