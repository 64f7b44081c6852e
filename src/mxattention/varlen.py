"""`varlen_attention`: 4-bit MX attention of packed variable-length batches (flash-attn's layout).

Sits beside `mxattention.dispatch` (above `attention` and `kernels`): arguments are checked here,
once; the call itself is the custom op `mxattention::varlen` (`mxattention.kernels.varlen_op`),
which runs the fused Triton kernels where `mxattention.scaled_dot_product_attention` would, and
otherwise the PyTorch reference, warning once per reason.
"""

from __future__ import annotations

import math

import torch

from mxattention.attention.config import AttentionConfig, get_method
from mxattention.attention.inputs import check_scalars
from mxattention.attention.varlen import check_varlen
from mxattention.kernels.op import config_key
from mxattention.kernels.varlen_op import varlen_op


def varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
    *,
    scale: float | None = None,
    is_causal: bool = False,
    method: str | AttentionConfig = "mxattention",
    return_lse: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Attention of each sequence of a packed batch on its own, as `flash_attn_varlen_func` lays it out.

    q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv] (fp32 / fp16 / bf16; H a multiple of
    Hkv: grouped-query attention without copies); `cu_seqlens_q` / `cu_seqlens_k` int32 [n + 1] on
    q's device, prefix sums from 0 to total: sequence i is rows cu[i]:cu[i+1]. The result equals n
    dense calls `scaled_dot_product_attention(q_i, k_i, v_i, ...)` bit for bit: MX blocks and tiles
    start at each sequence's first token. Sequences may be empty; one with queries and no keys gives
    O = 0 (lse = -inf); zero heads or head dims are served as the dense entry serves them. `is_causal` is top-left per sequence, as torch SDPA and the dense entry (key j
    attends query i iff j <= i); flash-attn aligns it bottom-right instead, which differs where a
    sequence has Lq != Lk. `max_seqlen_*`: at least the longest sequence (they size the kernel grid);
    None computes them. The prefix sums are read on the host once per call (a sync on CUDA) to be
    checked. Returns O [total_q, H, Dv] in q's dtype and, with `return_lse`, the natural-log
    log-sum-exp [H, total_q] fp32 (flash-attn's varlen `softmax_lse` layout).

    Where it runs: as `scaled_dot_product_attention` (fused Triton kernels for CUDA tensors of a
    method they compute, one set of launches for the whole batch; else the PyTorch reference with a
    `ReferenceFallbackWarning` once per reason); methods with Q smoothing run one dense kernel call
    per sequence (the one-launch kernel does not smooth). `MXATTENTION_VARLEN_KERNEL=0` runs one dense
    kernel call per sequence for every method.

    Raises TypeError (q / k / v not fp32 / fp16 / bf16 tensors of one dtype, prefix sums not int32
    tensors, `is_causal` not a bool, `scale` not a number, `max_seqlen_*` not a non-negative int or
    None) or ValueError (shapes that disagree, H not
    a multiple of Hkv, prefix sums not 1-D of one length, on another device, not starting at 0,
    decreasing or not ending at the total, `max_seqlen_*` below the longest sequence, an unknown
    preset), each naming the argument. Inference only: a backward raises `InferenceOnlyError`.
    """
    cfg = get_method(method)
    check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    check_scalars(0.0, scale)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    # torch's 1/sqrt(D); with D = 0 every score is 0 under any scale (`attention.inputs.Shapes`).
    scale_ = (1.0 / math.sqrt(q.shape[-1]) if q.shape[-1] else 1.0) if scale is None else float(scale)
    key_ = method if isinstance(method, str) else config_key(cfg)
    mq = -1 if max_seqlen_q is None else max_seqlen_q
    mk = -1 if max_seqlen_k is None else max_seqlen_k
    out, lse = varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_k, mq, mk, is_causal, scale_, key_)
    return (out, lse) if return_lse else out
