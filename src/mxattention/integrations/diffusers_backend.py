"""mxattention as a diffusers attention backend (checked against diffusers 0.42.1).

Exposes `register_diffusers_backend`, `register_preset_backends`, `backend_name`, `backend_stats`,
`reset_backend_stats`, the varlen backend's `register_diffusers_varlen_backend`,
`varlen_backend_stats`, `reset_varlen_backend_stats`, and the context-parallel ops
`mxattention_forward_op` / `mxattention_backward_op`. Both kinds of backend are one registration
class (`_support.NamedBackend`), one backend function and one registry.

    from diffusers.models.attention_dispatch import attention_backend
    register_diffusers_backend()                       # name "mxattention", method "mxattention"
    transformer.set_attention_backend("mxattention")   # or: with attention_backend("mxattention"): ...

diffusers internals used (all in `diffusers.models.attention_dispatch`): `AttentionBackendName` (a
`str` Enum; a member is added at runtime so `AttentionBackendName(name)`, `__members__` and the
name checks of `attention_backend` / `set_attention_backend` accept it), `_AttentionBackendRegistry
.register(member, constraints, supports_context_parallel)` and `_templated_context_parallel_attention`
(ring / Ulysses, given our forward op). `dispatch_attention_fn` passes tensors [B, S, H, D] and only
the keyword arguments our function names. Register before anything resolves the name: setting
`DIFFUSERS_ATTN_BACKEND=mxattention` fails, since diffusers resolves it while importing.

Masks: bool (True = attend) or additive, as torch SDPA; a 2-D [B, Sk] key mask is read as
[B, 1, 1, Sk] like diffusers' native backend; HunyuanVideo's bool [B, 1, 1, N] key mask is served
(SageAttention's backends refuse masks). GQA, `scale` and `is_causal` pass through. Calls the 4-bit path
cannot serve (dropout, fp64, ...) run torch's SDPA, counted by reason in `backend_stats(name)` (which
also counts the mask dtypes / shapes seen), warned once per reason per registration
(`mxattention.FallbackWarning`, attributed to the line that called the model), or refused with
`strict=True` (`mxattention.FallbackError`). Inputs that require grad are quantized and a backward
through them raises `mxattention.InferenceOnlyError`; `autograd="torch"` runs torch's SDPA for them.

torch.compile: Dynamo traces diffusers' dispatcher and this backend; each call is one opaque node, the
custom op `mxattention::routed_sdpa` (varlen: `mxattention::varlen`; see `mxattention.ops`), which
makes the policy's decision, counts and computes at run time: the counts are of executed calls, the
output that of eager execution.

Context parallelism: `supports_context_parallel=True`. Ring attention calls the forward op once per
key chunk with `return_lse=True` and merges the (out, lse) pairs; Ulysses calls it once on all keys of
a head subset. The method of each call is decided once (the op `mxattention::route_decide`, at run
time also when compiled) and passed to every chunk's forward op. Full-precision methods merge to the
single-device result up to fp32 rounding. Quantized methods quantize P~ against the running max of the keys seen, so ring results depend on the split
(the PNQ row sums stay exactly one); Ulysses results do not. Inference only: the backward op raises
`InferenceOnlyError`; with `autograd="torch"`, calls that track gradients run diffusers' native
context-parallel attention (Ulysses only: it has no log-sum-exp for the ring).

The varlen backend ("mxattention_varlen", `register_diffusers_varlen_backend`) has the contract of
diffusers' `flash_varlen` / `sage_varlen` backends: [B, S, H, D] tensors and a bool key mask; batch b
attends its valid keys only, as one sequence of `mxattention.varlen_attention` (docs/design.md,
'Varlen'): the MX blocks of V and P~ start at its first valid key, so masked keys take no part in any
block scale (the dense backend with the same mask quantizes V blocks that hold masked keys too) and
the result equals the dense call on the valid keys, bit for bit. Where the valid keys are a prefix of
each row (padding at the end: HunyuanVideo's text mask), nothing is copied: the padding becomes
sequences without queries. Other key masks gather the valid keys (one copy of K and V, as
flash_varlen's packing). Masks that are not a bool key mask (float, or varying over queries or
heads), and everything the dense backend does not serve, run torch's SDPA: counted, warned once per
reason, refused with `strict=True`. No policy, no context parallelism (use the dense backend for
those). A batch row with no valid key gives O = 0 (torch gives NaN). Inference only.
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Any

import torch
from diffusers.models import attention_dispatch as _ad

from mxattention.attention.config import PRESETS, AttentionConfig, get_method
from mxattention.attention.inputs import sdpa_problem
from mxattention.integrations._support import NamedBackend, add_enum_member, check_policy, original_sdpa
from mxattention.integrations.policy import PrecisionPolicy
from mxattention.ops.call import routed, routed_replay, routed_sdpa, varlen_op
from mxattention.ops.entry import scaled_dot_product_attention as mx_sdpa
from mxattention.ops.errors import InferenceOnlyError, inference_only_message
from mxattention.ops.memo import signature
from mxattention.ops.route import (
    THREAD_SITE,
    check_options,
    route_decide,
    torch_attention_with_lse,
    tracks_grad,
)

DEFAULT_NAME = "mxattention"
VARLEN_MASK = "varlen_mask"  # the fallback reason of a mask the varlen backend does not take
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_\-]*$")


_lock = threading.Lock()
_registry: dict[str, NamedBackend] = {}


def backend_name(method: str | AttentionConfig) -> str:
    """The backend name of a method: its name in snake case, prefixed "mxattention_" unless it starts so
    ("mxattention", "mxattention_no_hadamard", "mxattention_fp", "mxattention_mxfp4_ocp", ...)."""
    name = get_method(method).name.replace("-", "_").lower()
    return name if name.startswith(DEFAULT_NAME) else f"{DEFAULT_NAME}_{name}"


def _enum_member(name: str) -> _ad.AttentionBackendName:
    """The AttentionBackendName member of value `name`, added to the enum if missing."""
    enum_cls = _ad.AttentionBackendName
    if name in enum_cls._value2member_map_:
        return enum_cls(name)
    attr = re.sub(r"\W", "_", name).upper()
    if attr in enum_cls._member_map_:
        raise ValueError(f"AttentionBackendName already has a member {attr}")
    return add_enum_member(enum_cls, attr, name, str.__new__(enum_cls, name))


def _key_mask(attn_mask: torch.Tensor | None, batch: int, k_len: int) -> torch.Tensor | None:
    """diffusers' 2-D [B, Sk] key mask as [B, 1, 1, Sk], as its native backend reads it."""
    if attn_mask is not None and attn_mask.ndim == 2 and attn_mask.shape == (batch, k_len):
        return attn_mask[:, None, None, :]
    return attn_mask


def _varlen_mask_ok(mask: torch.Tensor, batch: int, k_len: int) -> bool:
    """Whether `mask` is a bool key-padding mask the varlen backend takes ([B or 1, 1, 1, Sk] after
    `_key_mask`, or fewer leading dims)."""
    shape = (1,) * (4 - mask.ndim) + tuple(mask.shape)
    return (
        mask.dtype == torch.bool
        and mask.ndim <= 4
        and shape[1:3] == (1, 1)
        and shape[0] in (1, batch)
        and shape[3] == k_len
    )


def mxattention_forward_op(
    ctx: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    return_lse: bool = False,
    _save_ctx: bool = True,
    _parallel_config: Any = None,
    *,
    method: str | AttentionConfig = "mxattention",
    native: bool = False,
    router: str | None = None,
    decision: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The forward op diffusers' templated ring / Ulysses attention calls.

    query [B, Sq, H, D], key / value [B, Sk, Hkv, D]; returns out [B, Sq, H, Dv] in the input dtype
    and, with `return_lse`, lse [B, Sq, H] (fp32, natural log), the layout of diffusers' flash ops.
    `native` runs torch's SDPA instead of `method`; where the lse is asked for (ring) torch's flash
    attention op that returns it (CPU: any mask; CUDA: fp16 / bf16 without mask), else the "fp"
    method. With `router` (a registration's token) and `decision` (from `route_decide`), the
    registration's decided method runs instead, through `mxattention::routed_sdpa`. `ctx` is unused:
    nothing is saved, there is no backward.
    """
    mask = _key_mask(attn_mask, query.shape[0], key.shape[1])
    if mask is not None and mask.shape[-1] != key.shape[1]:
        raise ValueError(
            f"attn_mask covers {mask.shape[-1]} keys but this chunk has {key.shape[1]}: diffusers' ring "
            "attention does not rotate the mask with the keys; use Ulysses for masked attention"
        )
    q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))
    if router is not None:
        scale_ = None if scale is None else float(scale)
        # The decision (route_decide) already holds the site and step.
        out, lse = routed_sdpa(
            q, k, v, mask, is_causal, scale_, enable_gqa, return_lse, router, decision, THREAD_SITE, None
        )
        out = out.permute(0, 2, 1, 3)
        return (out, lse.permute(0, 2, 1)) if return_lse else out
    if native and not return_lse:
        return _native(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa)
    pair = torch_attention_with_lse(q, k, v, mask, is_causal, scale) if native and dropout_p == 0 else None
    if pair is None:
        pair = mx_sdpa(
            q,
            k,
            v,
            mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            method="fp" if native else method,
            return_lse=True,
        )
    out, lse = pair
    out = out.permute(0, 2, 1, 3)
    return (out, lse.permute(0, 2, 1)) if return_lse else out


def _native(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa) -> torch.Tensor:
    """torch's own SDPA on [B, H, S, D] tensors, returned in diffusers' [B, S, H, D] layout."""
    out = original_sdpa(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
    )
    return out.permute(0, 2, 1, 3)


def mxattention_backward_op(ctx: Any, grad_out: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
    """Raises `InferenceOnlyError`: mxattention's 4-bit path has no backward."""
    raise InferenceOnlyError(inference_only_message("mxattention's diffusers backend (context parallel)"))


def _native(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa) -> torch.Tensor:
    """torch's own SDPA on [B, H, S, D] tensors, returned in diffusers' [B, S, H, D] layout."""
    out = original_sdpa(
        q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
    )
    return out.permute(0, 2, 1, 3)


def _context_parallel(
    reg: NamedBackend,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    return_lse: bool,
    parallel_config: Any,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    if reg.autograd == "torch" and tracks_grad(query, key, value):
        reg.note_fallback("autograd")
        return _ad._native_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, parallel_config
        )
    # Decided once per attention call, not per ring step, so every key chunk uses the same method.
    decision = route_decide(reg.token, query.shape[1], key.shape[1], mask, *reg.where())
    return _ad._templated_context_parallel_attention(
        query,
        key,
        value,
        attn_mask,
        dropout_p,
        is_causal,
        scale,
        enable_gqa,
        return_lse,
        forward_op=functools.partial(mxattention_forward_op, router=reg.token, decision=decision),
        backward_op=mxattention_backward_op,
        _parallel_config=parallel_config,
    )


def _check_inputs(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    **kwargs: Any,
) -> None:
    # Run by diffusers only when DIFFUSERS_ATTN_CHECKS is set; the call itself checks everything.
    for name, t in (("query", query), ("key", key), ("value", value)):
        if t.ndim != 4:
            raise ValueError(f"{name} must be [batch, seq_len, heads, head_dim], got shape {tuple(t.shape)}")
    if query.shape[-1] != key.shape[-1] or key.shape[1] != value.shape[1]:
        raise ValueError(
            f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)} disagree"
        )


def check_backend_name(name: object) -> None:
    """Raise ValueError unless `name` is a backend name diffusers keeps as given (it lower-cases names)."""
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"backend name must be lower case letters, digits, '_' or '-', got {name!r}")


def _backend_fn(name: str) -> Any:
    # diffusers passes only the keyword arguments named in this signature. The body is the whole
    # backend, dense and varlen: static checks here (Dynamo traces them), the rest in the op.
    def mxattention_backend(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
        return_lse: bool = False,
        _parallel_config: Any = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        reg = _registry[name]
        b, sk = query.shape[0], key.shape[1]
        mask = attn_mask
        # `_key_mask` written out: each call on the way to the launch costs host time (tests/ops).
        if mask is not None and mask.ndim == 2 and mask.shape == (b, sk):  # [B, Sk] as [B, 1, 1, Sk]
            mask = mask[:, None, None, :]
        decision, sig = None, None
        if _parallel_config is None and not reg.varlen:
            # A call like one the kernels served before: decided, counted and replayed in diffusers'
            # layout (`ops.memo`: the program needs only the addresses, which the permuted views share).
            sig = signature(reg.token, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
            decision, pair = routed_replay(
                reg.token, sig, (query, key, value, mask), query.shape[1], sk, mask
            )
            if pair is not None:
                out, lse = pair
                out = out.permute(0, 2, 1, 3)
                return (out, lse.permute(0, 2, 1)) if return_lse else out
        if _parallel_config is not None:  # the varlen backend is registered without context parallelism
            return _context_parallel(
                reg,
                query,
                key,
                value,
                attn_mask,
                mask,
                dropout_p,
                is_causal,
                scale,
                enable_gqa,
                return_lse,
                _parallel_config,
            )
        q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))
        reason = sdpa_problem(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa)
        if reason is None and reg.varlen and mask is not None and not _varlen_mask_ok(mask, b, sk):
            reason = VARLEN_MASK
        if reason is None and reg.autograd == "torch" and tracks_grad(query, key, value):
            reason = "autograd"
        if reason is not None:
            if return_lse:
                raise ValueError(
                    f"{reg.label} cannot serve this call ({reason}) and torch's SDPA returns no lse"
                )
            reg.note_fallback(reason)
            return _native(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa)
        scale_ = None if scale is None else float(scale)
        if reg.varlen:  # counted in the op (no policy: always quantized)
            out, lse = varlen_op(
                query, key, value, None, None, -1, -1, is_causal, scale_, reg.method_key, mask, reg.token
            )
            return (out, lse) if return_lse else out
        if sig is not None:  # a plain eager call (`memo.signature`): the op's body without its dispatch
            out, lse = routed(
                q,
                k,
                v,
                mask,
                is_causal,
                scale_,
                enable_gqa,
                return_lse,
                reg.token,
                decision,
                THREAD_SITE,
                None,
                sig,
            )
        else:
            site, step = reg.where() if torch.compiler.is_compiling() else (THREAD_SITE, None)
            out, lse = routed_sdpa(
                q, k, v, mask, is_causal, scale_, enable_gqa, return_lse, reg.token, None, site, step
            )
        out = out.permute(0, 2, 1, 3)
        return (out, lse.permute(0, 2, 1)) if return_lse else out

    mxattention_backend.__qualname__ = mxattention_backend.__name__ = f"mxattention_backend[{name}]"
    return mxattention_backend


def _register(
    name: str, cfg: AttentionConfig, policy: PrecisionPolicy | None, strict: bool, autograd: str, varlen: bool
) -> str:
    check_backend_name(name)
    with _lock:
        old = _registry.get(name)
        if old is None and name in _ad.AttentionBackendName._value2member_map_:
            raise ValueError(f"{name!r} is one of diffusers' own attention backends; choose another name")
        if old is not None and (old.method, old.strict, old.autograd, old.varlen) == (
            cfg,
            strict,
            autograd,
            varlen,
        ):
            if old.policy is policy:
                return name
        member = _enum_member(name)
        kind = "varlen backend" if varlen else "backend"
        _registry[name] = NamedBackend(
            name,
            cfg,
            policy,
            label=f"mxattention diffusers {kind} {name!r}",
            strict=strict,
            autograd=autograd,
            varlen=varlen,
        )
        if old is None:
            constraints = [] if varlen else [_check_inputs]
            _ad._AttentionBackendRegistry.register(
                member, constraints=constraints, supports_context_parallel=not varlen
            )(_backend_fn(name))
    return name


def register_diffusers_backend(
    method: str | AttentionConfig = "mxattention",
    name: str | None = None,
    policy: PrecisionPolicy | None = None,
    *,
    strict: bool = False,
    autograd: str = "error",
) -> str:
    """Register (or re-point) the diffusers backend `name` running `method`; returns the name.

    The backend receives diffusers' [B, S, H, D] tensors (fp32 / fp16 / bf16; masks bool or additive,
    a 2-D [B, Sk] key mask read as [B, 1, 1, Sk]) and returns O [B, S, H, Dv] in their dtype (and lse
    [B, S, H] fp32 where diffusers asks for it). Each call runs `mxattention.scaled_dot_product_attention`:
    the fused kernels on CUDA where they compute the method, else the PyTorch reference (CPU
    included, a `ReferenceFallbackWarning` once per reason); calls it cannot serve run torch's SDPA,
    counted in `backend_stats(name)`, with a `FallbackWarning` once per reason. It supports diffusers'
    context parallelism (ring / Ulysses) through `mxattention_forward_op`.

    `name` defaults to `backend_name(method)`; it must be lower case (diffusers lower-cases names).
    Calling again with the same method, policy object and options does nothing; with others it
    re-points the name (and restarts its stats). `policy` keeps chosen calls in high precision; attach
    its hooks with `policy.attach(transformer_or_pipeline)`. `strict` and `autograd` as
    `mxattention.patch_sdpa`: raise `FallbackError` instead of falling back; "torch" runs torch's SDPA
    for calls that track gradients (default "error": quantized, and a backward raises).

    Raises ValueError for an unknown preset, a name that is not lower case letters, digits, "_" or
    "-", a name of one of diffusers' own backends, or an unknown `autograd`; TypeError for a `policy`
    that is not a PrecisionPolicy or a `strict` that is not a bool. Needs diffusers
    (`pip install 'mxattention[diffusers]'`).
    """
    cfg = get_method(method)
    check_policy(policy)
    check_options(strict, autograd)
    return _register(backend_name(cfg) if name is None else name, cfg, policy, strict, autograd, False)


def register_preset_backends(policy: PrecisionPolicy | None = None) -> list[str]:
    """Register one backend per preset ("mxattention", "mxattention_fp", "mxattention_mxfp4_ocp", ...)."""
    return [register_diffusers_backend(m, policy=policy) for m in PRESETS]


def register_diffusers_varlen_backend(
    method: str | AttentionConfig = "mxattention",
    name: str | None = None,
    *,
    strict: bool = False,
    autograd: str = "error",
) -> str:
    """Register (or re-point) the diffusers varlen backend `name` running `method`; returns the name.

    `name` defaults to `backend_name(method) + "_varlen"` ("mxattention_varlen", ...); `strict` and
    `autograd` as `register_diffusers_backend`. There is no `policy`: every call this backend serves is
    quantized with `method` (a `PrecisionPolicy` needs the dense backend, `register_diffusers_backend`).

    The backend receives diffusers' [B, S, H, D] tensors (fp32 / fp16 / bf16) and a bool key-padding
    mask ([B, Sk] or [B, 1, 1, Sk], True = attend), and returns O [B, S, H, Dv] in their dtype; each
    batch row runs as one sequence of `mxattention.varlen_attention` on its valid keys: the fused
    kernels on CUDA where they compute the method, else the PyTorch reference (CPU included, a
    `ReferenceFallbackWarning` once per reason). Other masks and calls the 4-bit path cannot serve run
    torch's SDPA, counted in `varlen_backend_stats(name)`, with a `FallbackWarning` once per reason.
    No context parallelism. Raises ValueError for an unknown preset, a name that is not lower case
    letters, digits, "_" or "-", a name of one of diffusers' own backends, or an unknown `autograd`;
    TypeError for a `strict` that is not a bool. Needs diffusers (`pip install 'mxattention[diffusers]'`).
    """
    cfg = get_method(method)
    check_options(strict, autograd)
    return _register(
        backend_name(cfg) + "_varlen" if name is None else name, cfg, None, strict, autograd, True
    )


def _get(name: str, varlen: bool) -> NamedBackend:
    reg = _registry.get(name)
    if reg is None or reg.varlen != varlen:
        kind = "varlen backend" if varlen else "backend"
        names = sorted(n for n, r in _registry.items() if r.varlen == varlen)
        raise ValueError(f"no mxattention {kind} named {name!r}; registered: {names}")
    return reg


def backend_stats(name: str = DEFAULT_NAME) -> dict[str, Any]:
    """Counts of the backend `name`: routed / high_precision / fallback (by reason) calls, masks seen
    as {(dtype, shape): calls}, and the method it runs."""
    reg = _get(name, False)
    return {**reg.calls.as_dict(), "method": reg.method.name}


def reset_backend_stats(name: str = DEFAULT_NAME) -> None:
    """Restart the counts of the backend `name`."""
    _get(name, False).calls.reset()


def varlen_backend_stats(name: str = "mxattention_varlen") -> dict[str, Any]:
    """Counts of the varlen backend `name`: routed / fallback (by reason) calls, masks seen, method."""
    reg = _get(name, True)
    return {**reg.calls.as_dict(), "method": reg.method.name}


def reset_varlen_backend_stats(name: str = "mxattention_varlen") -> None:
    """Restart the counts of the varlen backend `name`."""
    _get(name, True).calls.reset()
