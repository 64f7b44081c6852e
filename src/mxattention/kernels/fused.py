"""`fused_attention`: pre-pass + attention kernel for one call, executing its `plan.KernelPlan`.

Exposes `fused_attention` (plans the call with `plan.plan_call`, or takes a plan, and runs it),
`run_plan` (the execution of a dense plan, its head chunks on the streams of `plan_streams`) and
`FusedOutput` (O, lse, Q(P~) or None). The plan's
predicates and rules (`unsupported_reason`, `scale_reason`, `launch_config`, `kv_heads_per_chunk`,
the constants) live in `kernels.plan` and are re-exported here for their callers.
Inputs are [B, H, L, D] (the argument checks of `attention.inputs` are the caller's job).
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import torch

from mxattention.attention.config import AttentionConfig
from mxattention.attention.reference import cast_output
from mxattention.kernels import builds, program
from mxattention.kernels.plan import (
    CPU_KERNELS_ENV,
    F32_MAX,
    KV_LAYOUTS,
    LOG2E,
    MAX_HEAD_DIM,
    KernelPlan,
    chunk_bytes,
    chunk_streams_for,
    cpu_kernels_requested,
    kv_heads_per_chunk,
    launch_config,
    plan_call,
    replan,
    scale_reason,
    smoothing_heads_per_chunk,
    unsupported_reason,
)
from mxattention.kernels.specs import BuildFailure

__all__ = [
    "CPU_KERNELS_ENV",
    "F32_MAX",
    "KV_LAYOUTS",
    "LOG2E",
    "MAX_HEAD_DIM",
    "FusedOutput",
    "chunk_bytes",
    "chunk_streams_for",
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
    chunk_streams: int | None = None,
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
    K^ + V^ take at most this many bytes (at least one head per group; on two streams, the two
    groups alive at once, see `chunk_streams`); "auto" (default) means
    max(plan.KV_CHUNK_MIN_BYTES, the packed K/V bytes of the call), None one group. With Q smoothing
    its correction (fp32, 4 ceil(Lq / smooth_q_block) bytes per key and query head) obeys the same bound, on
    either layout. Calls with more than plan.GRID_Y_MAX batch x query heads also run in groups of batches.
    `fwd_kernel`: "tl" (`attention_fwd`), "gluon" (`attention_fwd_hopper`, sm_90: dense unmasked
    bf16-layout calls at head dim 128; the same bits) or None (`attention_fwd_hopper.fwd_kernel_for`).
    `chunk_streams`: 1 (the head chunks in order on the caller's stream), 2 (half-size chunks
    alternately on it and a side stream: the same bits and peak) or None (`plan.chunk_streams_for`).
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
            chunk_streams=chunk_streams,
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


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def plan_streams(plan: KernelPlan, device: torch.device) -> list[torch.cuda.Stream | None]:
    """The streams chunk i runs on (index i % n): [None] (the current stream, no switch) for a
    one-stream plan or off CUDA; else [the caller's current stream, a side stream of the device]
    (one per device, kept: a stream of torch's pool other than the caller's)."""
    if plan.chunk_streams == 1 or device.type != "cuda":
        return [None]
    caller = torch.cuda.current_stream(device)
    index = caller.device_index
    side = _SIDE_STREAMS.get(index)
    while side is None or side.cuda_stream == caller.cuda_stream:
        side = torch.cuda.Stream(device)  # torch's pool hands out its streams in turn
    _SIDE_STREAMS[index] = side
    return [caller, side]


def run_plan(
    plan: KernelPlan,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> FusedOutput:
    """Execute a dense plan (`plan_call` of these inputs) chunk by chunk (see `fused_attention`).
    A kernel that does not build here (`specs.BuildFailure`: a Gluon pass, a `tl` forward past
    shared memory) is recorded by the planner, and the plan made again takes the fallback. A cached
    single-chunk plan records its first run as a `program.CallProgram` and replays it after."""
    while True:
        table = plan.launches
        made = None if table is None else table.get(program.PROGRAM_SLOT)
        if isinstance(made, program.CallProgram):
            out, lse = made.run((query, key, value, mask))
            return FusedOutput(cast_output(out, query.dtype), lse, None)
        try:
            if (made is None or made < program.ATTEMPTS) and program.eligible(plan):
                with program.Recording() as rec:
                    got = _run_dense(plan, query, key, value, mask=mask, is_causal=is_causal)
                prog = rec.program((query, key, value, mask), (got.out, got.lse))
                table[program.PROGRAM_SLOT] = prog if prog is not None else (made or 0) + 1
            else:
                got = _run_dense(plan, query, key, value, mask=mask, is_causal=is_causal)
            return FusedOutput(cast_output(got.out, query.dtype), got.lse, got.p_hat)
        except BuildFailure as failure:
            builds.record(failure)
            fallback = replan(plan, query, key, value, mask=mask, is_causal=is_causal)
            if fallback == plan:  # nothing left to fall back to
                raise
            plan = fallback


def _run_dense(
    plan: KernelPlan,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    is_causal: bool,
) -> FusedOutput:
    from mxattention.attention.operands import q_block_mean_rows

    assert plan.runs and not plan.varlen
    query, key = scaled_operands(plan, query, key)
    b, hq, lq, _ = query.shape
    dv = value.shape[3]
    # The interpreter's fp32 -> bf16 cast truncates (Triton 3.9); there torch does the final cast.
    out_dtype = torch.float32 if plan.interpreted else query.dtype
    out = torch.empty((b, hq, lq, dv), dtype=out_dtype, device=query.device)
    lse = torch.empty((b, hq, lq), dtype=torch.float32, device=query.device)
    dbg = None
    if plan.debug_p:
        dbg = torch.zeros((b, hq, lq, plan.lk_pad), dtype=torch.float32, device=query.device)
    qm_all = None
    if plan.smooth_q_block:
        # Q smoothing's block means, the reference's own function (on the whole query, as it takes
        # them), summed in fp32 without an fp32 copy of the query.
        qm_all = q_block_mean_rows(query, plan.smooth_q_block).contiguous()
    # docs/design.md, 'Head chunks on two streams': chunk i allocates and runs on streams[i % n], so
    # its buffers go back to that stream's pool and chunk i + n reuses them behind its kernel in
    # stream order. The side stream starts after the caller's work so far (the inputs, the means,
    # out / lse allocated), and the caller's stream waits for it before anything reads out or lse.
    streams = plan_streams(plan, query.device)
    if len(streams) > 1:
        streams[1].wait_stream(streams[0])
    held: list[tuple | None] = [None] * len(streams)
    for i in range(len(plan.chunks)):
        slot = i % len(streams)
        on = contextlib.nullcontext() if streams[slot] is None else torch.cuda.stream(streams[slot])
        with on:
            # Chunk i - n's operands back to this stream's pool before chunk i allocates: at most
            # n chunks' operands alive at once (`KernelPlan.live_kv_heads`).
            held[slot] = None
            held[slot] = _run_chunk(plan, i, query, key, value, out, lse, dbg, qm_all, mask, is_causal)
    if len(streams) > 1:
        streams[0].wait_stream(streams[1])
    del held
    return FusedOutput(out, lse, dbg)  # out as the kernel wrote it (fp32 on the interpreter)


def _run_chunk(
    plan: KernelPlan,
    index: int,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    dbg: torch.Tensor | None,
    qm_all: torch.Tensor | None,
    mask: torch.Tensor | None,
    is_causal: bool,
) -> tuple:
    """Pre-pass and kernel of chunk `index` on the current stream, writing its slices of out, lse and
    dbg; returns its operands, which the caller keeps referenced while a kernel may read them. A
    cached plan's launches go through their slots (`launch.launch`: compiled kernels, directly)."""
    from mxattention.kernels.attention_fwd import mx_attention_fwd
    from mxattention.kernels.attention_fwd_hopper import mx_attention_fwd_hopper
    from mxattention.kernels.prepass import prepass_qk, prepass_v
    from mxattention.kernels.smoothing import smoothing_correction

    if plan.mma == "fp8":
        return _run_chunk_fp8(plan, plan.chunks[index], query, key, value, out, lse, dbg, mask, is_causal)
    lq, hk, lk, dv = query.shape[2], key.shape[1], key.shape[2], value.shape[3]
    bm, bn, lkp, qe = plan.block_m, plan.block_n, plan.lk_pad, plan.qk_elem  # (the passes' lengths)
    wide = plan.kv_layout == "bf16"
    group = query.shape[1] // hk
    blk = plan.smooth_q_block
    q_rule, k_rule, v_rule = plan.rules
    chunk = plan.chunks[index]
    table = plan.launches

    def slot(name: str) -> tuple[dict, object] | None:
        return None if table is None else (table, (index, name))

    (b0, b1), (h0, h1) = chunk.batches, chunk.kv_heads
    bs, kv, qh = slice(b0, b1), slice(h0, h1), slice(h0 * group, h1 * group)
    whole = len(plan.chunks) == 1  # the whole call: its tensors as they are (no views per call)

    def part(x: torch.Tensor | None, rows: slice) -> torch.Tensor | None:
        return x if whole or x is None else x[bs, rows]

    mask_chunk, out_chunk, lse_chunk = part(mask, qh), part(out, qh), part(lse, qh)

    smooth, q_mean = None, None
    if blk:
        q_mean = (part(qm_all, qh), blk)
        smooth = (smoothing_correction(part(qm_all, qh), part(key, kv), lkp, slot=slot("corr")), blk)
    qp = prepass_qk(
        part(query, qh),
        q_rule,
        hadamard=plan.hadamard,
        len_multiple=max(bm, 128),
        elem=qe,
        q_mean=q_mean,
        pass_plan=chunk.q_pass,
        slot=slot("q"),
    )
    kp = prepass_qk(
        part(key, kv),
        k_rule,
        hadamard=plan.hadamard,
        len_multiple=max(bn, 128),
        out_bf16=wide,
        elem=qe,
        pass_plan=chunk.k_pass,
        slot=slot("k"),
    )
    vp = prepass_v(
        part(value, kv),
        v_rule,
        len_multiple=max(bn, 128),
        out_bf16=wide,
        elem=plan.v_elem,
        pass_plan=chunk.v_pass,
        slot=slot("v"),
    )
    # lse's chunk is written in place where it is contiguous (one batch, or all heads), else copied.
    direct = lse_chunk.is_contiguous()
    if plan.fwd_kernel == "gluon":
        got = mx_attention_fwd_hopper(
            qp, kp, vp, spec=plan.fwd, slot=slot("fwd"), lq=lq, lk=lk, group=group, out=out_chunk,
            scale=plan.scale, smooth_q=smooth, lse=lse_chunk if direct else None,
        )  # fmt: skip
        if not direct:
            lse[bs, qh] = got
        return qp, kp, vp, smooth
    dbg_chunk = None if dbg is None else torch.zeros_like(dbg[bs, qh])
    got = mx_attention_fwd(
        qp,
        kp,
        vp,
        spec=plan.fwd,
        slot=slot("fwd"),
        lq=lq,
        lk=lk,
        dv=dv,
        group=group,
        out=out_chunk,
        scale=plan.scale,
        mask=mask_chunk,
        debug_p=dbg_chunk,
        smooth_q=smooth,
        lse=lse_chunk if direct else None,
    )
    if not direct:
        lse[bs, qh] = got
    if dbg is not None:
        dbg[bs, qh] = dbg_chunk  # the kernel indexes its buffer as a contiguous [B, heads, Lq, Lk']
    return qp, kp, vp, smooth


def _run_chunk_fp8(plan, chunk, query, key, value, out, lse, dbg, mask, is_causal) -> tuple:
    """`_run_chunk` for a plan whose `mma` is "fp8": the fast mode's pre-passes and folds
    (`attention_fwd_fp8.fp8_operands_from_inputs`), then the plan's FP8 kernel (the portable `tl`
    one, `attention_fwd_fp8`, or the Gluon one on sm_90, `attention_fwd_hopper_fp8`); writes this
    chunk's slices of out, lse (and dbg); returns the operands, which the caller keeps referenced
    while the kernel may read them."""
    from mxattention.kernels.attention_fwd_fp8 import fp8_operands_from_inputs, mx_attention_fwd_fp8
    from mxattention.kernels.prepass import FOLD_OUTS, V_ANCHORED_OUT

    lq, hk, lk, dv = query.shape[2], key.shape[1], key.shape[2], value.shape[3]
    group = query.shape[1] // hk
    (b0, b1), (h0, h1) = chunk.batches, chunk.kv_heads
    bs, kv, qh = slice(b0, b1), slice(h0, h1), slice(h0 * group, h1 * group)
    lm, ln = max(plan.block_m, 128), max(plan.block_n, 128)
    # The fast mode's packed passes as the plan made them; a plan made with other passes (written by
    # hand, e.g. in a benchmark) gets them planned here.
    fast_outs = (*FOLD_OUTS.values(), V_ANCHORED_OUT)
    passes = tuple(p if p.out in fast_outs else None for p in (chunk.q_pass, chunk.k_pass, chunk.v_pass))
    ops = fp8_operands_from_inputs(
        query[bs, qh], key[bs, kv], value[bs, kv], plan.rules, hadamard=plan.hadamard, scale=plan.scale,
        q_len_multiple=lm, k_len_multiple=ln, slots=plan.fwd_kernel == "gluon", passes=passes,
    )  # fmt: skip
    if plan.fwd_kernel == "gluon":  # the warp-specialized sm_90 kernel (`attention_fwd_hopper_fp8`)
        from mxattention.kernels.attention_fwd_hopper_fp8 import mx_attention_fwd_hopper_fp8

        lse[bs, qh] = mx_attention_fwd_hopper_fp8(
            *ops, spec=plan.fwd, lq=lq, lk=lk, group=group, out=out[bs, qh]
        )
        return ops
    dbg_chunk = None if dbg is None else torch.zeros_like(dbg[bs, qh])
    lse[bs, qh] = mx_attention_fwd_fp8(
        *ops, lq=lq, lk=lk, dv=dv, group=group, out=out[bs, qh], p_rule=plan.p_rule, pnq=plan.pnq,
        block_n=plan.block_n, is_causal=is_causal, mask=None if mask is None else mask[bs, qh],
        block_m=plan.block_m, num_warps=plan.num_warps, num_stages=plan.num_stages, debug_p=dbg_chunk,
        p_cvt=plan.p_cvt,
    )  # fmt: skip
    if dbg is not None:
        dbg[bs, qh] = dbg_chunk
    return ops
