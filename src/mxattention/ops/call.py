"""The torch custom ops of a call: one opaque node for torch.compile, kernel or reference inside.

Exposes the attention ops, none of which calls another:

- `sdpa_op` (`mxattention::sdpa`): the public dense entry's call, (O, lse) of the method a key names.
- `routed_sdpa` (`mxattention::routed_sdpa`): a patch's or a framework backend's dense call: the
  router its token names decides (policy, counts) inside the op, then the quantized method, the
  high-precision method or torch's SDPA runs, all at run time. A separate op from `sdpa_op` only
  because its Python state changes on every run: it is an ordered effectful op tagged
  cudagraph-unsafe, while the public entry's op may be captured in a CUDA graph.
- `varlen_op` (`mxattention::varlen`): packed variable-length attention (the public varlen entry),
  or a padded [B, S, H, D] batch with a bool key mask (the diffusers varlen backend, which also
  passes its router to be counted).
- `no_backward` (`mxattention::no_backward`): the backward of each of them, raising
  `InferenceOnlyError` when a backward pass runs (not when one is traced).

The method crosses the boundary as an interned key (`attention.keys.method_key`). The choice between
the fused kernels and the PyTorch reference is the plan's (`kernels.plan.KernelPlan.reason`), made
inside the op at run time, with one `ReferenceFallbackWarning` per reason. The arguments were checked
once, at the entry (`attention.inputs.sdpa_problem`, `attention.varlen.check_varlen`); inside, only
the prefix sums' values (`attention.varlen.seq_bounds`, a host read) are checked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch._library.effects import EffectType

from mxattention.attention.keys import config_from_key, method_key
from mxattention.attention.sdpa import checked_sdpa_reference
from mxattention.attention.varlen import VarlenShapes, seq_bounds, varlen_reference
from mxattention.kernels.fused import run_plan
from mxattention.kernels.fused_varlen import (
    fused_varlen_attention,
    per_sequence_attention,
    varlen_kernel_enabled,
)

# The planner, through this one import (the plan cache, keyed by the call's signature).
from mxattention.kernels.plan import cached_plan, kernel_plan
from mxattention.ops import route
from mxattention.ops.errors import InferenceOnlyError, inference_only_message, warn_reference_once
from mxattention.ops.memo import program, remember, replay

_TAGS = (torch.Tag.cudagraph_unsafe,)


def dense(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    method: str,
    memo: tuple | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O [B, Hq, Lq, Dv] in query's dtype, lse [B, Hq, Lq] fp32) of checked [B, H, L, D] arguments:
    the fused kernels where the plan serves the call, else the reference. `scale` None: 1/sqrt(D).
    `memo`: the call's `memo.signature`, given the plan's program once it has one."""
    b, hq, lq, d = query.shape
    if scale is None:  # torch's 1/sqrt(D); with D = 0 every score is 0 under any scale
        scale = 1.0 / math.sqrt(d) if d else 1.0
    mask = None if attn_mask is None else attn_mask.expand(b, hq, lq, key.shape[2])
    if 0 in (*query.shape, *key.shape, *value.shape):
        # Zero-size dims: nothing for the kernels to do; the reference returns torch SDPA's result.
        return checked_sdpa_reference(query, key, value, mask, is_causal, scale, config_from_key(method))
    plan = cached_plan(method, query, key, value, scale, mask=mask, is_causal=is_causal)
    if plan.reason is not None:
        warn_reference_once(plan.reason)
        return checked_sdpa_reference(query, key, value, mask, is_causal, scale, config_from_key(method))
    out, lse, _ = run_plan(plan, query, key, value, mask=mask, is_causal=is_causal)
    if memo is not None:
        remember(memo, plan.launches)
    return out, lse


@torch.library.custom_op("mxattention::no_backward", mutates_args=())
def no_backward(
    grad: torch.Tensor, q_shape: Sequence[int], k_shape: Sequence[int], v_shape: Sequence[int], where: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of a 4-bit call: raises `InferenceOnlyError` (its fake gives q / k / v-shaped
    gradients, so a forward that tracks gradients still compiles)."""
    raise InferenceOnlyError(inference_only_message(where))


@no_backward.register_fake
def _no_backward_fake(grad, q_shape, k_shape, v_shape, where):
    return grad.new_empty(q_shape), grad.new_empty(k_shape), grad.new_empty(v_shape)


def register_inference_only(op, where: str) -> None:
    """Give the custom op `op` (q, k, v first; outputs first O) a backward that raises."""

    def setup_context(ctx, inputs, output) -> None:
        ctx.shapes = [list(t.shape) for t in inputs[:3]]

    def backward(ctx, grad_out, *rest):
        dq, dk, dv = no_backward(grad_out, *ctx.shapes, where)
        return (dq, dk, dv, *(None for _ in range(len(op._opoverload._schema.arguments) - 3)))

    op.register_autograd(backward, setup_context=setup_context)


@torch.library.custom_op("mxattention::sdpa", mutates_args=())
def sdpa_op(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
    enable_gqa: bool,
    method: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O [B, Hq, Lq, Dv] in query's dtype, lse [B, Hq, Lq] fp32) of the method `method` keys."""
    return dense(query, key, value, attn_mask, is_causal, scale, method)


@sdpa_op.register_fake
def _sdpa_fake(query, key, value, attn_mask, is_causal, scale, enable_gqa, method):
    b, hq, lq, _ = query.shape
    out = query.new_empty((b, hq, lq, value.shape[-1]))
    return out, query.new_empty((b, hq, lq), dtype=torch.float32)


def routed(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    return_lse: bool,
    router: str,
    decision: torch.Tensor | None,
    site: int = route.THREAD_SITE,
    step: torch.Tensor | None = None,
    memo: tuple | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The body of `routed_sdpa` (see there), which a plain eager call (`memo.plain_eager`) runs without
    the op's dispatch: (O, lse), lse whatever the call computed (None for torch's SDPA without
    `return_lse`); the op returns the empty placeholder where `return_lse` is false, a plain call
    skips that allocation (~2 us of host). `memo`: the call's `memo.signature` (see `dense`)."""
    r = route._routers.get(router) or route.lookup(router)  # lookup raises for a router that is gone
    d = r.decide(query.shape[-2], key.shape[-2], attn_mask, site, step) if decision is None else int(decision)
    route._local.busy = True  # SDPA calls made while computing go to the function a patch replaced
    try:
        if d == route.QUANTIZED:
            return dense(query, key, value, attn_mask, is_causal, scale, r.method_key, memo)
        if d == route.HIGH_METHOD:
            method = r.policy.high_precision_method if r.policy is not None else "fp"
            return dense(query, key, value, attn_mask, is_causal, scale, method_key(method))
        if not return_lse:
            return r.native(query, key, value, attn_mask, is_causal, scale, enable_gqa).contiguous(), None
        # native with its log-sum-exp: torch's flash op where one serves the call, else "fp"
        pair = route.torch_attention_with_lse(query, key, value, attn_mask, is_causal, scale)
        return pair if pair is not None else dense(query, key, value, attn_mask, is_causal, scale, "fp")
    finally:
        route._local.busy = False


def routed_replay(
    router: str,
    sig: tuple | None,
    roots: Sequence[torch.Tensor | None],
    q_len: int,
    k_len: int,
    attn_mask: torch.Tensor | None,
    site: int = route.THREAD_SITE,
    step: torch.Tensor | None = None,
) -> tuple[int | None, tuple[torch.Tensor, torch.Tensor] | None]:
    """A router's call whose signature `sig` (`memo.signature` of its own arguments) has a program:
    the decision, made and counted here as `routed` makes it, and where it is QUANTIZED (O, lse) of
    the program run on `roots` (query, key, value, mask in any layout at the recorded addresses).
    (None, None) where the memo has no program for `sig`: nothing decided, the caller goes on."""
    prog = program(sig)
    if prog is None:
        return None, None
    r = route._routers.get(router) or route.lookup(router)
    d = r.decide(q_len, k_len, attn_mask, site, step)
    return d, (replay(prog, roots) if d == route.QUANTIZED else None)


@torch.library.custom_op("mxattention::routed_sdpa", mutates_args=(), tags=_TAGS)
def routed_sdpa(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    return_lse: bool,
    router: str,
    decision: torch.Tensor | None,
    site: int = route.THREAD_SITE,
    step: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One call of the router `router` on checked [B, H, L, D] inputs: `decision` (from
    `route_decide`) or None to decide here, with the policy's `site` and `step` (`Router.where`).
    Returns (O [B, Hq, Lq, Dv], lse [B, Hq, Lq] fp32, or empty without `return_lse`)."""
    out, lse = routed(
        query, key, value, attn_mask, is_causal, scale, enable_gqa, return_lse, router, decision, site, step
    )
    if not return_lse:
        lse = query.new_empty((0,), dtype=torch.float32)
    return out.contiguous(), lse.contiguous()


@routed_sdpa.register_fake
def _routed_sdpa_fake(
    query,
    key,
    value,
    attn_mask,
    is_causal,
    scale,
    enable_gqa,
    return_lse,
    router,
    decision,
    site=route.THREAD_SITE,
    step=None,
):
    b, hq, lq, _ = query.shape
    lse_shape = (b, hq, lq) if return_lse else (0,)
    return query.new_empty((b, hq, lq, value.shape[-1])), query.new_empty(lse_shape, dtype=torch.float32)


def packed(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int | None,
    max_seqlen_k: int | None,
    is_causal: bool,
    scale: float,
    method: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O [total_q, H, Dv] in q's dtype, lse [H, total_q] fp32) of a checked packed call."""
    cfg = config_from_key(method)
    # The prefix sums' values can only be read here, in the op: seq_bounds checks them.
    (tq, hq, d), (tk, hk, dv) = q.shape, (k.shape[0], k.shape[1], v.shape[2])
    shapes = VarlenShapes(tq, tk, hq, hk, d, dv, cu_seqlens_q.numel() - 1)
    cu_q, cu_k, max_q, max_k = seq_bounds(cu_seqlens_q, cu_seqlens_k, shapes, max_seqlen_q, max_seqlen_k)
    if 0 in (hq, d, dv):  # as the dense op: nothing for the kernels; the reference's result
        return varlen_reference(q, k, v, cu_q, cu_k, cfg, is_causal=is_causal, scale=scale)
    varlen = (cu_seqlens_q, cu_seqlens_k, max_q, max_k)
    on_gpu_kernel = varlen_kernel_enabled()  # else one dense call per sequence
    plan = kernel_plan(cfg, q, k, v, scale, is_causal=is_causal, varlen=varlen, varlen_kernel=on_gpu_kernel)
    if plan.reason is not None:
        warn_reference_once(plan.reason)
        return varlen_reference(q, k, v, cu_q, cu_k, cfg, is_causal=is_causal, scale=scale)
    if plan.varlen == "per_sequence":
        return per_sequence_attention(q, k, v, cu_q, cu_k, cfg, is_causal=is_causal, scale=scale)
    return fused_varlen_attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_q, max_k, cfg, is_causal=is_causal, scale=scale, plan=plan
    )


def padded(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    method: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O [B, Sq, H, Dv], lse [B, Sq, H] fp32) of each batch row on its valid keys: query [B, Sq, H, D],
    key / value [B, Sk, Hkv, D], `key_mask` None or a bool key mask [B or 1, 1, 1, Sk] (True = attend)."""
    b, sq, hq, d = query.shape
    sk, dv = key.shape[1], value.shape[-1]
    dev = query.device
    if b == 0:  # no sequence (varlen takes at least one): nothing to attend
        return query.new_empty((0, sq, hq, dv)), query.new_empty((0, sq, hq), dtype=torch.float32)
    if scale is None:  # torch's 1/sqrt(D); with D = 0 every score is 0 under any scale
        scale = 1.0 / math.sqrt(d) if d else 1.0
    rows = torch.arange(b, device=dev, dtype=torch.int32)
    q = query.reshape(b * sq, hq, d)
    if key_mask is None:
        k, v = key.reshape(b * sk, *key.shape[2:]), value.reshape(b * sk, *value.shape[2:])
        cu_q = torch.arange(b + 1, device=dev, dtype=torch.int32) * sq
        cu_k = torch.arange(b + 1, device=dev, dtype=torch.int32) * sk
    else:
        key_mask = key_mask.reshape(-1, sk).expand(b, sk)  # [B or 1, 1, 1, Sk] or fewer leading dims
        n = key_mask.sum(-1, dtype=torch.int32)
        prefix = torch.arange(sk, device=dev)[None, :] < n[:, None]
        if bool(torch.equal(prefix, key_mask)):
            # Row b's keys b*Sk : b*Sk + n_b are sequence 2b; its padding is sequence 2b + 1, without queries.
            k, v = key.reshape(b * sk, *key.shape[2:]), value.reshape(b * sk, *value.shape[2:])
            starts = torch.stack([rows * sk, rows * sk + n], dim=1).flatten()
            cu_k = torch.cat([starts, starts.new_full((1,), b * sk)])
            q_starts = torch.stack([rows * sq, (rows + 1) * sq], dim=1).flatten()
            cu_q = torch.cat([q_starts, q_starts.new_full((1,), b * sq)])
        else:
            k, v = key[key_mask], value[key_mask]  # the valid keys of each row, in order: one copy
            cu_k = torch.cat([n.new_zeros(1), n.cumsum(0, dtype=torch.int32)])
            cu_q = torch.arange(b + 1, device=dev, dtype=torch.int32) * sq
    out, lse = packed(q, k, v, cu_q, cu_k, sq, sk, is_causal, scale, method)
    return out.view(b, sq, hq, dv), lse.view(hq, b, sq).permute(1, 2, 0).contiguous()


@torch.library.custom_op("mxattention::varlen", mutates_args=(), tags=_TAGS)
def varlen_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor | None,
    cu_seqlens_k: torch.Tensor | None,
    max_seqlen_q: int,
    max_seqlen_k: int,
    is_causal: bool,
    scale: float | None,
    method: str,
    key_mask: torch.Tensor | None = None,
    router: str = "",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed: (O [total_q, H, Dv] in q's dtype, lse [H, total_q] fp32) of the method `method` keys
    (max_seqlen -1 for "compute it"). Padded (`cu_seqlens_*` None): q [B, Sq, H, D], k / v
    [B, Sk, Hkv, D] and `key_mask` None or bool [B or 1, 1, 1, Sk], each row a sequence on its valid
    keys; gives (O [B, Sq, H, Dv], lse [B, Sq, H]). `router`: a router's token, counted here (its decision is
    always QUANTIZED: varlen registrations have no policy). Tagged cudagraph-unsafe: the prefix sums
    are read on the host."""
    if router:
        route.lookup(router).decide(q.shape[1], k.shape[1], key_mask)
    if cu_seqlens_q is None or cu_seqlens_k is None:
        return padded(q, k, v, key_mask, is_causal, scale, method)
    given = (None if max_seqlen_q < 0 else max_seqlen_q, None if max_seqlen_k < 0 else max_seqlen_k)
    assert scale is not None  # the public entry resolves it
    return packed(q, k, v, cu_seqlens_q, cu_seqlens_k, *given, is_causal, scale, method)


@varlen_op.register_fake
def _varlen_fake(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    is_causal,
    scale,
    method,
    key_mask=None,
    router="",
):
    if cu_seqlens_q is None:
        b, sq, hq, _ = q.shape
        return q.new_empty((b, sq, hq, v.shape[-1])), q.new_empty((b, sq, hq), dtype=torch.float32)
    tq, hq, _ = q.shape
    return q.new_empty((tq, hq, v.shape[-1])), q.new_empty((hq, tq), dtype=torch.float32)


routed_sdpa.register_effect(EffectType.ORDERED)
register_inference_only(sdpa_op, "mxattention.scaled_dot_product_attention")
register_inference_only(routed_sdpa, "mxattention (patched attention)")
register_inference_only(varlen_op, "mxattention.varlen_attention")
