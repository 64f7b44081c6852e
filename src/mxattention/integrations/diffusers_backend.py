"""mxattention as a diffusers attention backend (checked against diffusers 0.42.1).

Exposes `register_diffusers_backend`, `register_preset_backends`, `backend_name`, `backend_stats`,
`reset_backend_stats`, and the context-parallel ops `mxattention_forward_op` / `mxattention_backward_op`.

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
custom op `mxattention::routed_sdpa` (see `integrations._routing`), which makes the policy's decision,
counts and computes at run time: the counts are of executed calls, the output that of eager execution.

Context parallelism: `supports_context_parallel=True`. Ring attention calls the forward op once per
key chunk with `return_lse=True` and merges the (out, lse) pairs; Ulysses calls it once on all keys of
a head subset. The method of each call is decided once (the op `mxattention::route_decide`, at run
time also when compiled) and passed to every chunk's forward op. Full-precision methods merge to the
single-device result up to fp32 rounding. Quantized methods quantize P~ against the running max of the keys seen, so ring results depend on the split
(the PNQ row sums stay exactly one); Ulysses results do not. Inference only: the backward op raises
`InferenceOnlyError`; with `autograd="torch"`, calls that track gradients run diffusers' native
context-parallel attention (Ulysses only: it has no log-sum-exp for the ring).
"""

from __future__ import annotations

import functools
import re
import threading
from typing import Any

import torch
from diffusers.models import attention_dispatch as _ad

from mxattention.attention.config import PRESETS, AttentionConfig, get_method
from mxattention.dispatch import scaled_dot_product_attention as mx_sdpa
from mxattention.integrations._routing import (
    NamedBackend,
    check_options,
    route_decide,
    routed_sdpa,
    tracks_grad,
)
from mxattention.integrations._support import (
    add_enum_member,
    original_sdpa,
    torch_attention_with_lse,
    unsupported_reason,
)
from mxattention.integrations.policy import THREAD_SITE, PrecisionPolicy
from mxattention.kernels.op import InferenceOnlyError, inference_only_message

DEFAULT_NAME = "mxattention"
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


def _attention(
    reg: NamedBackend,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    return_lse: bool,
    parallel_config: Any,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    # Traced by Dynamo under torch.compile: static checks here, run-time decisions in the ops.
    mask = _key_mask(attn_mask, query.shape[0], key.shape[1])
    grad_to_torch = reg.autograd == "torch" and tracks_grad(query, key, value)
    if parallel_config is not None and grad_to_torch:
        reg.note_fallback("autograd")
        return _ad._native_attention(
            query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse, parallel_config
        )
    if parallel_config is not None:
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
    q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))
    reason = unsupported_reason(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa)
    if reason is None and grad_to_torch:
        reason = "autograd"
    if reason is not None and return_lse:
        raise ValueError(f"mxattention cannot serve this call ({reason}) and torch's SDPA returns no lse")
    if reason is not None:
        reg.note_fallback(reason)
        return _native(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa)
    scale_ = None if scale is None else float(scale)
    site, step = reg.where()
    out, lse = routed_sdpa(
        q, k, v, mask, is_causal, scale_, enable_gqa, return_lse, reg.token, None, site, step
    )
    out = out.permute(0, 2, 1, 3)
    return (out, lse.permute(0, 2, 1)) if return_lse else out


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
    # diffusers passes only the keyword arguments named in this signature.
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
        return _attention(
            _registry[name],
            query,
            key,
            value,
            attn_mask,
            dropout_p,
            is_causal,
            scale,
            enable_gqa,
            return_lse,
            _parallel_config,
        )

    mxattention_backend.__qualname__ = mxattention_backend.__name__ = f"mxattention_backend[{name}]"
    return mxattention_backend


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
    if policy is not None and not isinstance(policy, PrecisionPolicy):
        raise TypeError(f"policy must be a PrecisionPolicy or None, got {type(policy).__name__}")
    check_options(strict, autograd)
    name = backend_name(cfg) if name is None else name
    check_backend_name(name)
    with _lock:
        old = _registry.get(name)
        if old is None and name in _ad.AttentionBackendName._value2member_map_:
            raise ValueError(f"{name!r} is one of diffusers' own attention backends; choose another name")
        if (
            old is not None
            and old.method == cfg
            and old.policy is policy
            and (old.strict, old.autograd) == (strict, autograd)
        ):
            return name
        member = _enum_member(name)
        _registry[name] = NamedBackend(
            name,
            cfg,
            policy,
            label=f"mxattention diffusers backend {name!r}",
            strict=strict,
            autograd=autograd,
        )
        if old is None:
            _ad._AttentionBackendRegistry.register(
                member, constraints=[_check_inputs], supports_context_parallel=True
            )(_backend_fn(name))
    return name


def register_preset_backends(policy: PrecisionPolicy | None = None) -> list[str]:
    """Register one backend per preset ("mxattention", "mxattention_fp", "mxattention_mxfp4_ocp", ...)."""
    return [register_diffusers_backend(m, policy=policy) for m in PRESETS]


def _get(name: str) -> NamedBackend:
    try:
        return _registry[name]
    except KeyError:
        raise ValueError(f"no mxattention backend named {name!r}; registered: {sorted(_registry)}") from None


def backend_stats(name: str = DEFAULT_NAME) -> dict[str, Any]:
    """Counts of the backend `name`: routed / high_precision / fallback (by reason) calls, masks seen
    as {(dtype, shape): calls}, and the method it runs."""
    reg = _get(name)
    return {**reg.calls.as_dict(), "method": reg.method.name}


def reset_backend_stats(name: str = DEFAULT_NAME) -> None:
    _get(name).calls.reset()
