"""The torch custom op `mxattention::varlen`: packed variable-length attention as one opaque node.

Exposes `varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal,
scale, cfg_key)` (max_seqlen -1 for "compute it").

As `mxattention::sdpa` (kernels/op.py), whose `kernel_plan` it asks: the choice between the fused
kernels (`fused_varlen`) and the PyTorch reference (`attention.varlen`) is made inside the op at
run time, where the prefix sums are also read and checked on the host (one small device-to-host
copy per call), so a compiled graph holds one node and no data-dependent Python. Inference only:
a backward through the op raises.
"""

from __future__ import annotations

import torch

from mxattention.attention.varlen import VarlenShapes, seq_bounds, varlen_reference
from mxattention.kernels.fused_varlen import (
    fused_varlen_attention,
    per_sequence_attention,
    varlen_kernel_enabled,
)
from mxattention.kernels.op import _warn_once, config_from_key, kernel_plan, register_inference_only


@torch.library.custom_op("mxattention::varlen", mutates_args=())
def varlen_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    is_causal: bool,
    scale: float,
    cfg_key: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O [total_q, H, Dv] in q's dtype, lse [H, total_q] fp32) of the method `cfg_key` names."""
    cfg = config_from_key(cfg_key)
    # The arguments were checked once, by `varlen.varlen_attention` (attention.varlen.check_varlen);
    # the prefix sums' values can only be read here, in the op: seq_bounds checks them.
    (tq, hq, d), (tk, hk, dv) = q.shape, (k.shape[0], k.shape[1], v.shape[2])
    shapes = VarlenShapes(tq, tk, hq, hk, d, dv, cu_seqlens_q.numel() - 1)
    given = (None if max_seqlen_q < 0 else max_seqlen_q, None if max_seqlen_k < 0 else max_seqlen_k)
    cu_q, cu_k, max_q, max_k = seq_bounds(cu_seqlens_q, cu_seqlens_k, shapes, *given)
    if 0 in (hq, d, dv):  # as mxattention::sdpa: nothing for the kernels; the reference's result
        return varlen_reference(q, k, v, cu_q, cu_k, cfg, is_causal=is_causal, scale=scale)
    varlen = (cu_seqlens_q, cu_seqlens_k, max_q, max_k)
    on_gpu_kernel = varlen_kernel_enabled()  # else one dense call per sequence
    plan = kernel_plan(cfg, q, k, v, scale, is_causal=is_causal, varlen=varlen, varlen_kernel=on_gpu_kernel)
    if plan.reason is not None:  # as mxattention::sdpa
        _warn_once(plan.reason)
        return varlen_reference(q, k, v, cu_q, cu_k, cfg, is_causal=is_causal, scale=scale)
    if plan.varlen == "per_sequence":
        return per_sequence_attention(q, k, v, cu_q, cu_k, cfg, is_causal=is_causal, scale=scale)
    return fused_varlen_attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, cfg, is_causal=is_causal, scale=scale, plan=plan
    )


@varlen_op.register_fake
def _varlen_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, is_causal, scale, cfg_key):
    tq, hq, _ = q.shape
    return q.new_empty((tq, hq, v.shape[-1])), q.new_empty((hq, tq), dtype=torch.float32)


register_inference_only(varlen_op, "mxattention.varlen_attention")
