"""`fused_attention`: pre-pass + attention kernel for one supported `AttentionConfig`, in torch terms.

Exposes `fused_attention`, `unsupported_reason` (why a config / input cannot use the kernels),
`scale_reason` / `kernel_scale` (the scales the kernel's fp32 constant holds, and how scales <= 0
are served), `launch_config` (the tiles and paths a call takes) and `kv_heads_per_chunk` (the
memory bound of the bf16 K^/V^ layout: groups of KV heads, each group's pre-pass and kernel run
before the next group's operands exist).
Inputs are [B, H, L, D] (the argument checks of `attention.inputs` are the caller's job).
"""

from __future__ import annotations

import itertools
import math
import os
import struct

import torch

from mxattention.attention.config import AttentionConfig
from mxattention.attention.reference import cast_output
from mxattention.kernels._triton import HAS_TRITON, kernels_interpreted
from mxattention.kernels.rules import KERNEL_ELEMS
from mxattention.kernels.targets import Target, current_target, fwd_tiles, matrix_path_for

MAX_HEAD_DIM = 256
KV_LAYOUTS = ("packed", "bf16")
CPU_KERNELS_ENV = "MXATTENTION_CPU_KERNELS"
# The bf16 K^/V^ layout runs in head chunks whose K^ + V^ take at most max(this, the packed K/V bytes
# of the whole call): extra memory stays within the packed operands plus a constant, and a chunk
# still fills the GPU for many waves (benchmarks/NOTES.md, v6).
KV_CHUNK_MIN_BYTES = 256 * 2**20
# Every kernel launches (tiles, batch x heads): CUDA's second grid axis holds at most 65535, so a call
# with more batch x heads runs in pieces of batches (and, past 65535 heads, of heads).
GRID_Y_MAX = 65535
LOG2E = 1.0 / math.log(2.0)
F32_MAX = 3.4028234663852886e38


def cpu_kernels_requested() -> bool:
    """MXATTENTION_CPU_KERNELS=1 (with TRITON_INTERPRET=1) sends CPU tensors through the interpreted
    kernels instead of the reference: a switch for tests and debugging, read at every call."""
    return os.environ.get(CPU_KERNELS_ENV, "0") not in ("", "0")


def unsupported_reason(cfg: AttentionConfig, query: torch.Tensor, head_dim: int, v_dim: int) -> str | None:
    """None if the fused kernels compute `cfg` on these inputs, else a sentence saying why not."""
    if not HAS_TRITON:
        return "Triton is not installed (pip install 'mxattention[gpu]')"
    if query.device.type != "cuda" and not (cpu_kernels_requested() and kernels_interpreted()):
        return f"the tensors are on {query.device.type}, the fused kernels need CUDA"
    specs = (cfg.q, cfg.k, cfg.v, cfg.p)
    if any(s is None for s in specs):
        return f"method {cfg.name!r} leaves an operand unquantized; the kernels quantize all of Q, K, V, P~"
    if any(s.format == "nvfp4" for s in specs):
        return f"method {cfg.name!r} uses NVFP4; NVFP4 baselines run on the PyTorch reference"
    if any(s.elem not in KERNEL_ELEMS for s in specs) or cfg.q.elem != cfg.k.elem:
        fmts = "/".join(s.format for s in specs)
        return (
            f"method {cfg.name!r} has Q/K/V/P~ formats {fmts}; the kernels compute MXFP4 or MXFP8 "
            "E4M3 operands, Q and K in the same one"
        )
    if cfg.smooth_k or cfg.p_row_scale != 1.0:
        return (
            f"method {cfg.name!r} uses SageAttention's K smoothing or P~ row scale, which the kernels "
            "do not implement"
        )
    if cfg.smooth_q and cfg.smooth_q_block % 128:
        return f"smooth_q_block={cfg.smooth_q_block} is not a multiple of 128 (the kernels' query tiles)"
    if cfg.block_n & (cfg.block_n - 1) or not 32 <= cfg.block_n <= 256:
        return f"block_n={cfg.block_n} is not a power of two in [32, 256] (a Triton tile)"
    if max(head_dim, v_dim) > MAX_HEAD_DIM:
        return f"head dim {max(head_dim, v_dim)} > {MAX_HEAD_DIM}"
    return None


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
):
    """(O [B, Hq, Lq, Dv] in query's dtype, lse [B, Hq, Lq] fp32) by the fused kernels.

    query [B, Hq, Lq, D], key [B, Hkv, Lk, D], value [B, Hkv, Lk, Dv] with Hq % Hkv == 0 (GQA without
    copies); `mask` None or a [B, Hq, Lq, Lk] broadcast view (bool or additive). With `debug_p`,
    also returns Q(P~) as fp32 [B, Hq, Lq, Lk'] (Lk' = Lk padded to block_n; zeros where no tile ran).
    `kv_layout`: "packed" (E2M1 bytes + E8M0 scales, decoded in the inner loop: 0.53 bytes per element)
    or "bf16" (the pre-pass writes the exact dequantized K^, V^ in bf16: 2 bytes per element, and the
    inner loop only multiplies); default "bf16" on the Hopper path, "packed" for dot_scaled.
    `kv_chunk_bytes` (bf16 layout): the pre-pass and the kernel run over groups of KV heads whose
    K^ + V^ take at most this many bytes (at least one head per group); "auto" (default) means
    max(KV_CHUNK_MIN_BYTES, the packed K/V bytes of the call), None one group. With Q smoothing
    its correction (fp32, 4 ceil(Lq / 128) bytes per key and query head) obeys the same bound, on
    either layout. Calls with more than GRID_Y_MAX batch x query heads also run in groups of batches.
    `fwd_kernel`: "tl" (`attention_fwd`), "gluon" (`attention_fwd_hopper`, sm_90: dense unmasked
    bf16-layout calls at head dim 128; the same bits) or None (`attention_fwd_hopper.fwd_kernel_for`).
    """
    from mxattention.attention.operands import q_block_mean_rows
    from mxattention.kernels.attention_fwd import mx_attention_fwd
    from mxattention.kernels.attention_fwd_hopper import (
        fwd_kernel_for,
        gluon_fwd_reason,
        mx_attention_fwd_hopper,
    )
    from mxattention.kernels.prepass import (
        padded_dim,
        padded_len,
        prepass_qk,
        prepass_v,
    )
    from mxattention.kernels.rules import rule_constants
    from mxattention.kernels.smoothing import smoothing_correction

    query, key, scale = kernel_scale(query, key, scale)
    b, hq, lq, d = query.shape
    hk, lk, dv = key.shape[1], key.shape[2], value.shape[3]
    bm, path, layout, num_warps, num_stages, options = launch_config(
        current_target(query.device), d, dv, matrix_path, block_m, kv_layout, num_warps, num_stages
    )
    bn = cfg.block_n
    wide = layout == "bf16"
    gluon_reason = gluon_fwd_reason(
        kv_bf16=wide, dq=d, dv=dv, block_n=bn, is_causal=is_causal, masked=mask is not None,
        debug_p=debug_p, smooth_q=cfg.smooth_q, p_elem=cfg.p.elem, qk_elem=cfg.q.elem, scale=scale,
    )  # fmt: skip
    gluon = fwd_kernel_for(current_target(query.device), gluon_reason, fwd_kernel) == "gluon"
    lkp = padded_len(lk, max(bn, 128))
    # The interpreter's fp32 -> bf16 cast truncates (Triton 3.9); there torch does the final cast.
    out_dtype = torch.float32 if kernels_interpreted() else query.dtype
    out = torch.empty((b, hq, lq, dv), dtype=out_dtype, device=query.device)
    lse = torch.empty((b, hq, lq), dtype=torch.float32, device=query.device)
    pr = rule_constants(cfg.p.rule, cfg.p.elem)
    dbg = torch.zeros((b, hq, lq, lkp), dtype=torch.float32, device=query.device) if debug_p else None
    group = hq // hk
    step = hk
    if wide:
        step = kv_heads_per_chunk(b, hk, lkp, padded_dim(d), padded_dim(dv), kv_chunk_bytes)
    blk = cfg.smooth_q_block
    if cfg.smooth_q:
        nb = -(-lq // blk)
        step = min(
            step,
            smoothing_heads_per_chunk(b, hk, group, nb, lkp, padded_dim(d), padded_dim(dv), kv_chunk_bytes),
        )
        # Q smoothing's block means, the reference's own function (on the whole query, as it takes
        # them), summed in fp32 without an fp32 copy of the query.
        qm_all = q_block_mean_rows(query, blk).contiguous()
    step = max(1, min(step, GRID_Y_MAX // group))  # query heads of one KV head and one batch fit
    bstep = max(1, GRID_Y_MAX // (step * group))
    for b0, h0 in itertools.product(range(0, b, bstep), range(0, hk, step)):
        bs, kv, qh = slice(b0, b0 + bstep), slice(h0, h0 + step), slice(h0 * group, (h0 + step) * group)
        qe, smooth, q_mean = cfg.q.elem, None, None
        if cfg.smooth_q:
            q_mean = (qm_all[bs, qh], blk)
            smooth = (smoothing_correction(qm_all[bs, qh], key[bs, kv], lkp), blk)
        qp = prepass_qk(
            query[bs, qh],
            cfg.q.rule,
            hadamard=cfg.hadamard,
            len_multiple=max(bm, 128),
            elem=qe,
            q_mean=q_mean,
        )
        kp = prepass_qk(
            key[bs, kv], cfg.k.rule, hadamard=cfg.hadamard, len_multiple=max(bn, 128), out_bf16=wide, elem=qe
        )
        vp = prepass_v(value[bs, kv], cfg.v.rule, len_multiple=max(bn, 128), out_bf16=wide, elem=cfg.v.elem)
        if dbg is not None:
            dbg_chunk = torch.zeros_like(dbg[bs, qh])
        if gluon:
            lse[bs, qh] = mx_attention_fwd_hopper(
                qp, kp, vp, lq=lq, lk=lk, group=group, out=out[bs, qh], p_rule=(pr.ceil, pr.q_exp, pr.q_mant),
                pnq=cfg.pnq, scale=scale, p_elem=cfg.p.elem, qk_elem=qe,
            )  # fmt: skip
            del qp, kp, vp, smooth, q_mean
            continue
        lse[bs, qh] = mx_attention_fwd(
            qp,
            kp,
            vp,
            lq=lq,
            lk=lk,
            dv=dv,
            group=group,
            out=out[bs, qh],
            p_rule=(pr.ceil, pr.q_exp, pr.q_mant),
            pnq=cfg.pnq,
            block_n=bn,
            scale=scale,
            is_causal=is_causal,
            mask=None if mask is None else mask[bs, qh],
            matrix_path=path,
            block_m=bm,
            num_warps=num_warps,
            num_stages=num_stages,
            compile_options=options,
            debug_p=None if dbg is None else dbg_chunk,
            p_elem=cfg.p.elem,
            v_elem=cfg.v.elem,
            qk_elem=qe,
            smooth_q=smooth,
        )
        if dbg is not None:
            dbg[bs, qh] = dbg_chunk  # the kernel indexes its buffer as a contiguous [B, heads, Lq, Lk']
        # Freed before the next chunk's pre-pass allocates (the stream orders the reuse), so the
        # peak holds one chunk's operands, not two.
        del qp, kp, vp, smooth, q_mean
    out = cast_output(out, query.dtype)  # the kernel saturates its own stores likewise
    return (out, lse, dbg) if debug_p else (out, lse)


def scale_reason(scale: float) -> str | None:
    """None if the kernel's fp32 constant |scale| * log2(e) is finite, else why the kernels cannot serve it."""
    if not math.isfinite(scale) or abs(scale) * LOG2E > F32_MAX:
        return f"scale={scale!r} is beyond the fused kernels' fp32 range (|scale| * log2(e) <= {F32_MAX:.3e})"
    return None


def kernel_scale(
    query: torch.Tensor, key: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(query, key, scale) with the same scores Q^ K^ * scale and an fp32 constant scale * log2(e) > 0.

    The kernel takes row maxima of the unscaled scores times that constant, which needs it > 0. A
    negative scale negates the smaller of Q and K (exact: negation commutes with the rotation,
    the symmetric MX cast and the dot); a zero one (or one whose constant is 0 in fp32) multiplies
    it by 0 and takes scale 1, so every score is 0 and a NaN / Inf operand still gives NaN, as
    the reference's (Q^ K^T) * 0 does. Costs one pass over that operand, only for scale <= 0.
    """
    reason = scale_reason(scale)
    if reason is not None:
        raise ValueError(reason)
    if scale > 0 and struct.unpack("f", struct.pack("f", scale * LOG2E))[0] > 0:
        return query, key, scale
    q_smaller = query.numel() <= key.numel()
    if scale < 0 and struct.unpack("f", struct.pack("f", -scale * LOG2E))[0] > 0:
        return (-query, key, -scale) if q_smaller else (query, -key, -scale)
    return (query * 0.0, key, 1.0) if q_smaller else (query, key * 0.0, 1.0)


def launch_config(
    target: Target | None,
    d: int,
    dv: int,
    matrix_path: str | None = None,
    block_m: int | None = None,
    kv_layout: str | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> tuple[int, str, str, int, int, tuple[tuple[str, int], ...]]:
    """(block_m, matrix path, K^/V^ layout, warps, stages, compile options) of a call on `target`
    (`targets.current_target(device)`; None: the interpreter), the None arguments defaulted from
    `targets.fwd_tiles` / `targets.matrix_path_for`: dense and varlen calls share them, so a varlen
    call computes each sequence as the dense call of its rows does, bit for bit; `codegen` builds
    the same launch offline."""
    from mxattention.kernels.prepass import padded_dim

    tiles = fwd_tiles(
        target, padded_dim(max(d, dv)), block_m=block_m, num_warps=num_warps, num_stages=num_stages
    )
    path = matrix_path or matrix_path_for(target)
    layout = kv_layout or ("bf16" if path == "bf16" else "packed")
    if layout not in KV_LAYOUTS:
        raise ValueError(f"kv_layout must be one of {KV_LAYOUTS}, got {layout!r}")
    return tiles.block_m, path, layout, tiles.num_warps, tiles.num_stages, tiles.options


def smoothing_heads_per_chunk(
    b: int,
    hk: int,
    group: int,
    nb: int,
    lkp: int,
    dp: int,
    dvp: int,
    kv_chunk_bytes: int | str | None = "auto",
) -> int:
    """KV heads per chunk of a Q-smoothing call: its correction, fp32 [B, group, nb, lkp] per KV
    head (nb query blocks), takes at most the bytes K^ + V^ may (`kv_chunk_bytes`, see
    `chunk_bytes`), at least one head. That bound grows with the packed K/V, so long calls keep
    several heads per launch (at 75k a bound of 256 MiB left 1 head: 591 programs, 4.5 waves of
    132 SMs, the last half empty); balanced as `kv_heads_per_chunk`."""
    if kv_chunk_bytes is None:
        return hk
    most = max(1, min(hk, chunk_bytes(b, hk, lkp, dp, dvp, kv_chunk_bytes) // (4 * b * group * nb * lkp)))
    return -(-hk // -(-hk // most))


def chunk_bytes(b: int, hk: int, lkp: int, dp: int, dvp: int, kv_chunk_bytes: int | str = "auto") -> int:
    """The bytes a head chunk's buffers may take: `kv_chunk_bytes`, or for "auto"
    max(KV_CHUNK_MIN_BYTES, the packed K/V bytes of the whole call)."""
    if kv_chunk_bytes == "auto":
        return max(KV_CHUNK_MIN_BYTES, int(b * hk * lkp * (dp + dvp) * (0.5 + 1 / 32)))
    if isinstance(kv_chunk_bytes, bool) or not isinstance(kv_chunk_bytes, int) or kv_chunk_bytes <= 0:
        raise ValueError(f"kv_chunk_bytes must be a positive int, 'auto' or None, got {kv_chunk_bytes!r}")
    return kv_chunk_bytes


def kv_heads_per_chunk(
    b: int, hk: int, lkp: int, dp: int, dvp: int, kv_chunk_bytes: int | str | None = "auto"
) -> int:
    """KV heads per chunk of the bf16 layout (see `fused_attention`'s `kv_chunk_bytes`), balanced so
    the chunks are equal but for the last: ceil(hk / ceil(hk / most))."""
    if kv_chunk_bytes is None:
        return hk
    per_head = 2 * b * lkp * (dp + dvp)  # bf16 K^ and V^ of one KV head, all batches
    most = max(1, min(hk, chunk_bytes(b, hk, lkp, dp, dvp, kv_chunk_bytes) // per_head))
    return -(-hk // -(-hk // most))
