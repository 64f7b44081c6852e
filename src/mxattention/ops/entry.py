"""The public entries: `scaled_dot_product_attention` (dense) and `varlen_attention` (packed).

Each checks its arguments once (`attention.inputs`, `attention.varlen.check_varlen`), turns the
method into its interned key and makes one custom op call (`ops.call`), which runs the fused Triton
kernels for CUDA tensors (or CPU tensors under TRITON_INTERPRET=1 with MXATTENTION_CPU_KERNELS=1)
of a method they compute (`kernels.plan.plan_call`), and otherwise the reference, warning once per
reason.
"""

from __future__ import annotations

import math

import torch

from mxattention.attention.config import AttentionConfig, get_method
from mxattention.attention.inputs import check_scale, check_sdpa
from mxattention.attention.keys import method_key
from mxattention.attention.varlen import check_varlen
from mxattention.ops.call import dense, sdpa_op, varlen_op
from mxattention.ops.memo import plain_eager, program, replay, signature


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
    one opaque node under torch.compile, with the same choice made at run time (a plain eager call
    that records no autograd runs the op's body directly: the same function, less host time).

    Raises TypeError (a non-tensor, another dtype, a mask of another dtype, `scale` not a number or a bool,
    `method` neither a str nor an AttentionConfig) or ValueError (inputs not 4-D, shapes that
    disagree, devices that differ, a mask that does not broadcast, is on another device or comes
    with `is_causal`, `dropout_p` != 0, an unknown preset), each naming the argument. Inference
    only: a backward pass through the result raises `mxattention.InferenceOnlyError`.
    """
    # A call like one the kernels served before replays its program (`ops.memo`: no check, no plan).
    sig = None
    if type(method) is str:
        sig = signature(method, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        prog = program(sig)
        if prog is not None:
            pair = replay(prog, (query, key, value, attn_mask))
            return pair if return_lse else pair[0]
    cfg = get_method(method)  # validates a preset name early
    scale_ = check_sdpa(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
    # A preset travels as its name: a plain string constant for torch.compile (torch 2.11's dynamo
    # cannot rebuild a frozen dataclass to call method_key on it).
    key_ = method if isinstance(method, str) else method_key(cfg)
    if plain_eager(query, key, value, attn_mask):  # the op's own body, without the dispatcher
        out, lse = dense(query, key, value, attn_mask, is_causal, scale_, key_, sig)
    else:
        out, lse = sdpa_op(query, key, value, attn_mask, is_causal, scale_, enable_gqa, key_)
    return (out, lse) if return_lse else out


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
    check_scale(scale)
    if not isinstance(is_causal, bool):
        raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")
    # torch's 1/sqrt(D); with D = 0 every score is 0 under any scale (`attention.inputs.check_sdpa`).
    d = q.shape[-1]
    scale_ = (1.0 / math.sqrt(d) if d else 1.0) if scale is None else float(scale)
    key_ = method if isinstance(method, str) else method_key(cfg)
    mq = -1 if max_seqlen_q is None else max_seqlen_q
    mk = -1 if max_seqlen_k is None else max_seqlen_k
    out, lse = varlen_op(q, k, v, cu_seqlens_q, cu_seqlens_k, mq, mk, is_causal, scale_, key_)
    return (out, lse) if return_lse else out
