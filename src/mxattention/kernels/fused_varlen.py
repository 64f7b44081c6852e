"""`fused_varlen_attention`: the pre-pass and the attention kernel on a packed variable-length batch.

Exposes `fused_varlen_attention` (plans the call with `plan.plan_call(..., varlen=...)`, or takes a
plan, and runs it), `per_sequence_attention` (one dense `fused_attention` call per sequence on
views: what MXATTENTION_VARLEN_KERNEL=0 runs, `KernelPlan.varlen` == "per_sequence") and `varlen_kernel_enabled` (which `plan_call` asks); `varlen_reason` is
`plan`'s. Inputs in flash-attn's varlen layout (q [total_q, H, D], k / v
[total_k, Hkv, D], int32 prefix sums; the checks of `attention.varlen` are the caller's job).

No padded copy of the batch is made (docs/design.md, 'Varlen'): the packed tensors enter the
passes as [1, H, total, D] views. Q^ and K^ are cast per row, so they stay in token order and the
dense passes (the Gluon ones on sm_90 included) serve them unchanged; V^ is cast in blocks of 32
keys that restart at each sequence (`prepass_v(..., varlen=...)`: sequence i from row
`varlen_v_start`, at most 32 - 1 rows of padding per sequence). The attention kernel runs one
program per (query tile, head, sequence), reading each sequence's offsets from the prefix sums, as
flash-attn's varlen kernels do; its tiles start at each sequence's first query and key, and the
keys of a sequence's last tile past its end are loaded as zeros. Each sequence thus gets the
operands, tiles and arithmetic of the dense call of its rows: the same O and lse, bit for bit.
Launches: 3 pre-pass + 1 attention per group of KV heads (one group unless the bf16 K^/V^ layout
needs more) and per 65535 sequences.
"""

from __future__ import annotations

import os

import torch

from mxattention.attention.config import AttentionConfig
from mxattention.attention.reference import cast_output
from mxattention.attention.varlen import per_sequence
from mxattention.kernels import builds
from mxattention.kernels._triton import kernels_interpreted
from mxattention.kernels.fused import fused_attention, scaled_operands
from mxattention.kernels.plan import KernelPlan, plan_call, varlen_reason
from mxattention.kernels.specs import BuildFailure

VARLEN_KERNEL_ENV = "MXATTENTION_VARLEN_KERNEL"

__all__ = [
    "VARLEN_KERNEL_ENV",
    "fused_varlen_attention",
    "per_sequence_attention",
    "varlen_kernel_enabled",
    "varlen_reason",
]


def varlen_kernel_enabled() -> bool:
    """True where the one-launch varlen kernel runs: everywhere unless MXATTENTION_VARLEN_KERNEL=0
    (then `per_sequence_attention`, one dense call per sequence; the interpreter always runs the
    kernel). On the H200 (2026-12-01) it equalled the dense calls per sequence and took 1.28 vs
    4.73 ms (8 videos) and 1.48 vs 124 ms (128 short sequences) (docs/design.md, 'Varlen')."""
    return kernels_interpreted() or os.environ.get(VARLEN_KERNEL_ENV, "1") not in ("", "0")


def per_sequence_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: list[int],
    cu_k: list[int],
    cfg: AttentionConfig,
    *,
    is_causal: bool = False,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O [total_q, H, Dv] in q's dtype, lse [H, total_q] fp32): one dense `fused_attention` call per
    sequence on views of its rows (no copies; GQA as the dense kernels), so each sequence's result is
    its dense call's by construction. One launch set per sequence: host-bound for many short ones.
    `cu_q` / `cu_k`: the checked prefix sums as lists (`attention.varlen.seq_bounds`)."""

    def attend(qi, ki, vi):
        return fused_attention(qi, ki, vi, cfg, is_causal=is_causal, scale=scale)[:2]

    return per_sequence(q, k, v, cu_q, cu_k, attend)


def fused_varlen_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    cfg: AttentionConfig,
    *,
    is_causal: bool = False,
    scale: float,
    matrix_path: str | None = None,
    block_m: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    kv_layout: str | None = None,
    kv_chunk_bytes: int | str | None = "auto",
    plan: KernelPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O [total_q, H, Dv] in q's dtype, lse [H, total_q] fp32) by the one-launch varlen kernels,
    as `plan` says (default: `plan.plan_call` of these arguments with `varlen`); a plan with
    `varlen` "per_sequence" (Q smoothing, or MXATTENTION_VARLEN_KERNEL=0) runs
    `per_sequence_attention` (the kernel options then take their dense defaults).

    `max_seqlen_*`: at least the longest sequence (they size the grids). Sequences with queries and
    no keys give O = 0 and lse = -inf. The keyword arguments are `fused.fused_attention`'s. Raises
    ValueError with the plan's reason when the kernels cannot compute the call.
    """
    from mxattention.kernels.attention_fwd import mx_attention_fwd
    from mxattention.kernels.prepass import prepass_qk, prepass_v

    if plan is None:
        plan = plan_call(
            cfg,
            q,
            k,
            v,
            scale=scale,
            is_causal=is_causal,
            varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k),
            varlen_kernel=True,
            matrix_path=matrix_path,
            block_m=block_m,
            num_warps=num_warps,
            num_stages=num_stages,
            kv_layout=kv_layout,
            kv_chunk_bytes=kv_chunk_bytes,
        )
    if not plan.runs:
        raise ValueError(plan.refusal)
    if plan.varlen == "per_sequence":  # Q smoothing (`plan.varlen_reason`): dense calls per sequence
        cu_q, cu_k = torch.stack([cu_seqlens_q, cu_seqlens_k]).tolist()
        return per_sequence_attention(q, k, v, cu_q, cu_k, cfg, is_causal=is_causal, scale=scale)
    q, k = scaled_operands(plan, q, k)  # scale <= 0 as the dense call: exact negation / zeroing
    tq, hq, _ = q.shape
    tk, hk, dv = k.shape[0], k.shape[1], v.shape[2]
    bm, bn, wide, qe = plan.block_m, plan.block_n, plan.kv_layout == "bf16", plan.qk_elem
    out_dtype = torch.float32 if plan.interpreted else q.dtype  # as fused_attention
    if tq == 0 or tk == 0:  # no rows, or no key for any row
        out = torch.zeros((tq, hq, dv), dtype=q.dtype, device=q.device)
        return out, torch.full((hq, tq), -float("inf"), device=q.device)
    # Every row is written: each sequence's programs cover its rows (max_seqlen_q >= its length).
    out = torch.empty((tq, hq, dv), dtype=out_dtype, device=q.device)
    lse = torch.empty((hq, tq), dtype=torch.float32, device=q.device)
    group = hq // hk
    assert plan.fwd_kernel == "tl"  # the Gluon forward serves dense calls only
    q_rule, k_rule, v_rule = plan.rules
    spec = plan.fwd
    for chunk in plan.chunks:
        (h0, h1) = chunk.kv_heads
        kv, qh = slice(h0, h1), slice(h0 * group, h1 * group)
        # [1, heads, total, D] views of the packed tensors: no copy.
        qx, kx, vx = (x[:, hs].permute(1, 0, 2)[None] for x, hs in ((q, qh), (k, kv), (v, kv)))
        qp = prepass_qk(
            qx, q_rule, hadamard=plan.hadamard, len_multiple=max(bm, 128), elem=qe, pass_plan=chunk.q_pass
        )
        kp = prepass_qk(
            kx,
            k_rule,
            hadamard=plan.hadamard,
            len_multiple=max(bn, 128),
            out_bf16=wide,
            elem=qe,
            pass_plan=chunk.k_pass,
        )
        vp = prepass_v(
            vx,
            v_rule,
            out_bf16=wide,
            varlen=(cu_seqlens_k, max_seqlen_k),
            elem=plan.v_elem,
            pass_plan=chunk.v_pass,
        )
        kw = dict(lq=tq, lk=tk, dv=dv, group=group, out=out[:, qh].permute(1, 0, 2)[None], scale=plan.scale)
        while True:
            try:
                lse[qh] = mx_attention_fwd(
                    qp, kp, vp, spec=spec, **kw, varlen=(cu_seqlens_q, cu_seqlens_k, max_seqlen_q)
                )[0]
                break
            except BuildFailure as failure:  # past shared memory: the planner's one stage fewer
                builds.record(failure)
                spec = builds.fitted(spec)
        del qp, kp, vp  # freed before the next group's pre-pass allocates
    return cast_output(out, q.dtype), lse  # the kernel saturates its own stores likewise
