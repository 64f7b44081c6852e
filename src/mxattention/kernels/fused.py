"""`fused_attention`: pre-pass + attention kernel for one call, executing its `plan.KernelPlan`.

Exposes `fused_attention` (plans the call with `plan.plan_call`, or takes a plan, and runs it),
`run_plan` (the execution of a dense plan) and `FusedOutput` (O, lse, Q(P~) or None). The plan's
predicates and rules (`unsupported_reason`, `scale_reason`, `launch_config`, `kv_heads_per_chunk`,
the constants) live in `kernels.plan` and are re-exported here for their callers.
Inputs are [B, H, L, D] (the argument checks of `attention.inputs` are the caller's job).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mxattention.attention.config import AttentionConfig
from mxattention.attention.reference import cast_output
from mxattention.kernels.plan import (
    CPU_KERNELS_ENV,
    F32_MAX,
    KV_LAYOUTS,
    LOG2E,
    MAX_HEAD_DIM,
    KernelPlan,
    chunk_bytes,
    cpu_kernels_requested,
    kv_heads_per_chunk,
    launch_config,
    plan_call,
    scale_reason,
    smoothing_heads_per_chunk,
    unsupported_reason,
)

__all__ = [
    "CPU_KERNELS_ENV",
    "F32_MAX",
    "KV_LAYOUTS",
    "LOG2E",
    "MAX_HEAD_DIM",
    "FusedOutput",
    "chunk_bytes",
    "cpu_kernels_requested",
    "fused_attention",
    "kv_heads_per_chunk",
    "launch_config",
    "run_plan",
    "scale_reason",
    "smoothing_heads_per_chunk",
    "unsupported_reason",
]


class FusedOutput(NamedTuple):
    """What `fused_attention` returns, whatever its flags: O [B, Hq, Lq, Dv] in query's dtype, lse
    [B, Hq, Lq] fp32, and with `debug_p` Q(P~) fp32 [B, Hq, Lq, Lk'] (else None)."""

    out: torch.Tensor
    lse: torch.Tensor
    p_hat: torch.Tensor | None


def fused_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cfg: AttentionConfig,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    scale: float,
    matrix_path: str | None = None,
    block_m: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    kv_layout: str | None = None,
    kv_chunk_bytes: int | str | None = "auto",
    debug_p: bool = False,
    fwd_kernel: str | None = None,
    plan: KernelPlan | None = None,
) -> FusedOutput:
    """`FusedOutput` (O [B, Hq, Lq, Dv] in query's dtype, lse [B, Hq, Lq] fp32, Q(P~) or None) by the
    fused kernels, as `plan` says (default: `plan.plan_call` of these arguments).

    query [B, Hq, Lq, D], key [B, Hkv, Lk, D], value [B, Hkv, Lk, Dv] with Hq % Hkv == 0 (GQA without
    copies); `mask` None or a [B, Hq, Lq, Lk] broadcast view (bool or additive). With `debug_p`,
    `p_hat` is Q(P~) as fp32 [B, Hq, Lq, Lk'] (Lk' = Lk padded to block_n; zeros where no tile ran).
    `kv_layout`: "packed" (E2M1 bytes + E8M0 scales, decoded in the inner loop: 0.53 bytes per element)
    or "bf16" (the pre-pass writes the exact dequantized K^, V^ in bf16: 2 bytes per element, and the
    inner loop only multiplies); default "bf16" on the Hopper path (but "packed" where V's padded
    head dim is 32 under Q's 64 on sm_90: `targets.NARROW_V_BROKEN`), "packed" for dot_scaled.
    `kv_chunk_bytes` (bf16 layout): the pre-pass and the kernel run over groups of KV heads whose
    K^ + V^ take at most this many bytes (at least one head per group); "auto" (default) means
    max(plan.KV_CHUNK_MIN_BYTES, the packed K/V bytes of the call), None one group. With Q smoothing
    its correction (fp32, 4 ceil(Lq / smooth_q_block) bytes per key and query head) obeys the same bound, on
    either layout. Calls with more than plan.GRID_Y_MAX batch x query heads also run in groups of batches.
    `fwd_kernel`: "tl" (`attention_fwd`), "gluon" (`attention_fwd_hopper`, sm_90: dense unmasked
    bf16-layout calls at head dim 128; the same bits) or None (`attention_fwd_hopper.fwd_kernel_for`).
    Raises ValueError with the plan's
    `refusal` when the kernels cannot compute the call (the method, the scale, the head dim).
    """
    if plan is None:
        plan = plan_call(
            cfg,
            query,
            key,
            value,
            scale=scale,
            mask=mask,
            is_causal=is_causal,
            matrix_path=matrix_path,
            block_m=block_m,
            num_warps=num_warps,
            num_stages=num_stages,
            kv_layout=kv_layout,
            kv_chunk_bytes=kv_chunk_bytes,
            fwd_kernel=fwd_kernel,
            debug_p=debug_p,
        )
    if not plan.runs:
        raise ValueError(plan.refusal)
    return run_plan(plan, query, key, value, mask=mask, is_causal=is_causal)


def scaled_operands(
    plan: KernelPlan, query: torch.Tensor, key: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(query, key) as the kernel takes them: `plan.scale_op` applied (`plan.scale_plan`)."""
    op = plan.scale_op
    if op == "negate_q":
        return -query, key
    if op == "negate_k":
        return query, -key
    if op == "zero_q":
        return query * 0.0, key
    if op == "zero_k":
        return query, key * 0.0
    return query, key


def run_plan(
    plan: KernelPlan,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> FusedOutput:
    """Execute a dense plan (`plan_call` of these inputs) chunk by chunk (see `fused_attention`)."""
    from mxattention.attention.operands import q_block_mean_rows
    from mxattention.kernels.attention_fwd import mx_attention_fwd
    from mxattention.kernels.attention_fwd_hopper import mx_attention_fwd_hopper
    from mxattention.kernels.prepass import prepass_qk, prepass_v
    from mxattention.kernels.smoothing import smoothing_correction

    assert plan.runs and not plan.varlen
    query, key = scaled_operands(plan, query, key)
    b, hq, lq, _ = query.shape
    hk, lk, dv = key.shape[1], key.shape[2], value.shape[3]
    bm, bn, lkp, qe = plan.block_m, plan.block_n, plan.lk_pad, plan.qk_elem
    wide = plan.kv_layout == "bf16"
    # The interpreter's fp32 -> bf16 cast truncates (Triton 3.9); there torch does the final cast.
    out_dtype = torch.float32 if plan.interpreted else query.dtype
    out = torch.empty((b, hq, lq, dv), dtype=out_dtype, device=query.device)
    lse = torch.empty((b, hq, lq), dtype=torch.float32, device=query.device)
    dbg = torch.zeros((b, hq, lq, lkp), dtype=torch.float32, device=query.device) if plan.debug_p else None
    group = hq // hk
    blk = plan.smooth_q_block
    if blk:
        # Q smoothing's block means, the reference's own function (on the whole query, as it takes
        # them), summed in fp32 without an fp32 copy of the query.
        qm_all = q_block_mean_rows(query, blk).contiguous()
    q_rule, k_rule, v_rule = plan.rules
    for chunk in plan.chunks:
        (b0, b1), (h0, h1) = chunk.batches, chunk.kv_heads
        bs, kv, qh = slice(b0, b1), slice(h0, h1), slice(h0 * group, h1 * group)
        smooth, q_mean = None, None
        if blk:
            q_mean = (qm_all[bs, qh], blk)
            smooth = (smoothing_correction(qm_all[bs, qh], key[bs, kv], lkp), blk)
        qp = prepass_qk(
            query[bs, qh],
            q_rule,
            hadamard=plan.hadamard,
            len_multiple=max(bm, 128),
            elem=qe,
            q_mean=q_mean,
            pass_plan=chunk.q_pass,
        )
        kp = prepass_qk(
            key[bs, kv],
            k_rule,
            hadamard=plan.hadamard,
            len_multiple=max(bn, 128),
            out_bf16=wide,
            elem=qe,
            pass_plan=chunk.k_pass,
        )
        vp = prepass_v(
            value[bs, kv],
            v_rule,
            len_multiple=max(bn, 128),
            out_bf16=wide,
            elem=plan.v_elem,
            pass_plan=chunk.v_pass,
        )
        if plan.fwd_kernel == "gluon":
            lse[bs, qh] = mx_attention_fwd_hopper(
                qp, kp, vp, lq=lq, lk=lk, group=group, out=out[bs, qh], p_rule=plan.p_rule,
                pnq=plan.pnq, scale=plan.scale, p_elem=plan.p_elem, qk_elem=qe, p_cvt=plan.p_cvt, smooth_q=smooth,
            )  # fmt: skip
        else:
            dbg_chunk = None if dbg is None else torch.zeros_like(dbg[bs, qh])
            lse[bs, qh] = mx_attention_fwd(
                qp,
                kp,
                vp,
                lq=lq,
                lk=lk,
                dv=dv,
                group=group,
                out=out[bs, qh],
                p_rule=plan.p_rule,
                pnq=plan.pnq,
                block_n=bn,
                scale=plan.scale,
                is_causal=is_causal,
                mask=None if mask is None else mask[bs, qh],
                matrix_path=plan.matrix_path,
                block_m=bm,
                num_warps=plan.num_warps,
                num_stages=plan.num_stages,
                compile_options=plan.compile_options,
                debug_p=dbg_chunk,
                p_elem=plan.p_elem,
                v_elem=plan.v_elem,
                qk_elem=qe,
                p_cvt=plan.p_cvt,
                smooth_q=smooth,
            )
            if dbg is not None:
                dbg[bs, qh] = dbg_chunk  # the kernel indexes its buffer as a contiguous [B, heads, Lq, Lk']
        # Freed before the next chunk's pre-pass allocates (the stream orders the reuse), so the
        # peak holds one chunk's operands, not two.
        del qp, kp, vp, smooth, q_mean
    out = cast_output(out, query.dtype)  # the kernel saturates its own stores likewise
    return FusedOutput(out, lse, dbg)
