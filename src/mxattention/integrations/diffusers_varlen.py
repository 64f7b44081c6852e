"""A diffusers varlen backend: padded batches with a key-padding mask as packed sequences.

Exposes `register_diffusers_varlen_backend`, `varlen_backend_stats`, `reset_varlen_backend_stats` and
the custom op `varlen_padded` (`mxattention::varlen_padded`).

    register_diffusers_varlen_backend()                   # name "mxattention_varlen"
    with attention_backend("mxattention_varlen"): ...     # or transformer.set_attention_backend(...)

The contract of diffusers' `flash_varlen` / `sage_varlen` backends (attention_dispatch.py): the
dispatcher passes [B, S, H, D] tensors and a bool key mask; batch b attends its valid keys only. Here
each batch row is a sequence of `mxattention.varlen_attention` (docs/design.md, 'Varlen'): the MX
blocks of V and P~ start at its first valid key, so masked keys take no part in any block scale (the
dense backend with the same mask quantizes V blocks that hold masked keys too) and the result equals
the dense call on the valid keys, bit for bit. Where the valid keys are a prefix of each row (padding
at the end: HunyuanVideo's text mask), nothing is copied: the padding becomes sequences without
queries. Other key masks gather the valid keys (one copy of K and V, as flash_varlen's packing).
Masks that are not a bool key mask (float, or varying over queries or heads), and everything the
dense backend does not serve, run torch's SDPA: counted, warned once per reason, refused with
`strict=True`. No policy, no context parallelism (use the dense "mxattention" backend for those).
A batch row with no valid key gives O = 0 (torch gives NaN). Inference only, as the dense backend.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
from diffusers.models import attention_dispatch as _ad

from mxattention.attention.config import AttentionConfig, get_method
from mxattention.integrations import _routing
from mxattention.integrations._routing import Router, check_options, route_decide, tracks_grad
from mxattention.integrations._support import original_sdpa, unsupported_reason
from mxattention.integrations.diffusers_backend import (
    _enum_member,
    _key_mask,
    backend_name,
    check_backend_name,
)
from mxattention.kernels.op import config_from_key, config_key, register_inference_only
from mxattention.varlen import varlen_attention

VARLEN_MASK = "varlen_mask"
_routing.REASONS.setdefault(
    VARLEN_MASK,
    (
        "a mask that is not a bool key-padding mask ([B, Sk] or [B, 1, 1, Sk], True = attend)",
        "use the dense 'mxattention' backend (register_diffusers_backend) for other masks",
    ),
)


@torch.library.custom_op("mxattention::varlen_padded", mutates_args=())
def varlen_padded(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    key_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
    cfg_key: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O [B, Sq, H, Dv], lse [B, Sq, H] fp32) of each batch row on its valid keys.

    query [B, Sq, H, D], key / value [B, Sk, Hkv, D]; `key_mask` None or bool [B, Sk] (True = attend).
    """
    b, sq, hq, d = query.shape
    sk, dv = key.shape[1], value.shape[-1]
    dev = query.device
    if b == 0:  # no sequence (varlen takes at least one): nothing to attend
        return query.new_empty((0, sq, hq, dv)), query.new_empty((0, sq, hq), dtype=torch.float32)
    rows = torch.arange(b, device=dev, dtype=torch.int32)
    q = query.reshape(b * sq, hq, d)
    if key_mask is None:
        k, v = key.reshape(b * sk, *key.shape[2:]), value.reshape(b * sk, *value.shape[2:])
        cu_q = torch.arange(b + 1, device=dev, dtype=torch.int32) * sq
        cu_k = torch.arange(b + 1, device=dev, dtype=torch.int32) * sk
    else:
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
    out, lse = varlen_attention(
        q,
        k,
        v,
        cu_q,
        cu_k,
        sq,
        sk,
        scale=scale,
        is_causal=is_causal,
        method=config_from_key(cfg_key),
        return_lse=True,
    )
    return out.view(b, sq, hq, dv), lse.view(hq, b, sq).permute(1, 2, 0).contiguous()


@varlen_padded.register_fake
def _varlen_padded_fake(query, key, value, key_mask, is_causal, scale, cfg_key):
    b, sq, hq, _ = query.shape
    return query.new_empty((b, sq, hq, value.shape[-1])), query.new_empty((b, sq, hq), dtype=torch.float32)


register_inference_only(varlen_padded, "mxattention's diffusers varlen backend")


class _VarlenRegistration(Router):
    """One registered varlen backend name: its method, options and counts."""

    def __init__(self, name: str, method: AttentionConfig, strict: bool, autograd: str) -> None:
        super().__init__(method, None, strict=strict, autograd=autograd)
        self.name = name
        self.label = f"mxattention diffusers varlen backend {name!r}"
        self.cfg_key = config_key(method)

    def native(self, query, key, value, attn_mask, is_causal, scale, enable_gqa) -> torch.Tensor:
        return original_sdpa(
            query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )


_lock = threading.Lock()
_registry: dict[str, _VarlenRegistration] = {}


def _padding_mask(mask: torch.Tensor | None, batch: int, k_len: int) -> torch.Tensor | str | None:
    """The bool key mask as [B, Sk], None without a mask, or VARLEN_MASK for any other mask."""
    if mask is None:
        return None
    shape = (1,) * (4 - mask.ndim) + tuple(mask.shape)
    if mask.dtype != torch.bool or mask.ndim > 4 or shape[1:3] != (1, 1) or shape[0] not in (1, batch):
        return VARLEN_MASK
    if shape[3] != k_len:
        return VARLEN_MASK
    return mask.reshape(shape[0], k_len).expand(batch, k_len).contiguous()


def _attention(
    reg: _VarlenRegistration,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    dropout_p: float,
    is_causal: bool,
    scale: float | None,
    enable_gqa: bool,
    return_lse: bool,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    # Traced by Dynamo under torch.compile: static checks here; counts and the call are ops.
    mask4 = _key_mask(attn_mask, query.shape[0], key.shape[1])
    q, k, v = (x.permute(0, 2, 1, 3) for x in (query, key, value))
    reason = unsupported_reason(q, k, v, mask4, dropout_p, is_causal, scale, enable_gqa)
    key_mask = None if reason is not None else _padding_mask(mask4, query.shape[0], key.shape[1])
    if reason is None and isinstance(key_mask, str):
        reason = key_mask
    if reason is None and reg.autograd == "torch" and tracks_grad(query, key, value):
        reason = "autograd"
    if reason is not None and return_lse:
        raise ValueError(f"{reg.label} cannot serve this call ({reason}) and torch's SDPA returns no lse")
    if reason is not None:
        reg.note_fallback(reason)
        return reg.native(q, k, v, mask4, is_causal, scale, enable_gqa).permute(0, 2, 1, 3)
    # Counts the call ("routed"). No site / step (the dense backend passes `*reg.where()`): a varlen
    # registration has no policy (Router(policy=None)), so where() would give the defaults and the
    # decision is always QUANTIZED; a policy here would need both, and the decision honoured.
    route_decide(reg.token, query.shape[1], key.shape[1], mask4)
    scale_ = None if scale is None else float(scale)
    out, lse = varlen_padded(query, key, value, key_mask, is_causal, scale_, reg.cfg_key)
    return (out, lse) if return_lse else out


def _backend_fn(name: str) -> Any:
    # diffusers passes only the keyword arguments named in this signature.
    def mxattention_varlen_backend(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
        return_lse: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        reg = _registry[name]
        return _attention(
            reg, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, return_lse
        )

    mxattention_varlen_backend.__qualname__ = f"mxattention_varlen_backend[{name}]"
    mxattention_varlen_backend.__name__ = mxattention_varlen_backend.__qualname__
    return mxattention_varlen_backend


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
    name = backend_name(cfg) + "_varlen" if name is None else name
    check_backend_name(name)
    with _lock:
        old = _registry.get(name)
        if old is None and name in _ad.AttentionBackendName._value2member_map_:
            raise ValueError(f"{name!r} is already an attention backend of diffusers'; choose another name")
        if old is not None and old.method == cfg and (old.strict, old.autograd) == (strict, autograd):
            return name
        member = _enum_member(name)
        _registry[name] = _VarlenRegistration(name, cfg, strict, autograd)
        if old is None:
            _ad._AttentionBackendRegistry.register(member, constraints=[], supports_context_parallel=False)(
                _backend_fn(name)
            )
    return name


def _get(name: str) -> _VarlenRegistration:
    try:
        return _registry[name]
    except KeyError:
        raise ValueError(
            f"no mxattention varlen backend named {name!r}; registered: {sorted(_registry)}"
        ) from None


def varlen_backend_stats(name: str = "mxattention_varlen") -> dict[str, Any]:
    """Counts of the varlen backend `name`: routed / fallback (by reason) calls, masks seen, method."""
    reg = _get(name)
    return {**reg.calls.as_dict(), "method": reg.method.name}


def reset_varlen_backend_stats(name: str = "mxattention_varlen") -> None:
    _get(name).calls.reset()
