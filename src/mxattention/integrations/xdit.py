"""mxattention as an xDiT (`xfuser`) attention backend (checked against xfuser 0.7.0).

Exposes `register_xdit_backend`, `xdit_backend_name`, `xdit_backend_stats` and `reset_xdit_backend_stats`.

    from mxattention.integrations import register_xdit_backend
    member = register_xdit_backend("mxattention")      # AttentionBackendType.MXATTENTION
    get_runtime_state().set_attention_backend(member)  # or --attention_backend mxattention, or
                                                       # USP(q, k, v, backend=member)

xfuser internals used (all in `xfuser.core.distributed.attention_backend`): `AttentionBackendType` (a
closed Enum; a member is added at runtime so `AttentionBackendType["MXATTENTION"]`, xfuser's
`--attention_backend` / `--cross_attention_backend` / hybrid schedules and `set_attention_backend`
accept it) and `register_attention_function(member)`, the decorator xfuser's own backends use. xfuser's
source is not patched. Its USP layer (`xfuser.model_executor.layers.usp`) calls the registered function
as `f(query, key, value, dropout_p=, is_causal=, attention_kwargs=)` on [B, H, S, D] tensors (after
Ulysses' all-to-all: all keys of a head subset; in ring attention once per key chunk, merging the
(out, lse) pairs with torch's `_templated_ring_attention`) and expects (out [B, H, Sq, Dv] in the input
dtype, lse [B, H, Sq] fp32, natural log).

`attention_kwargs`: "attn_mask" (torch SDPA's bool / additive mask), "valid_kv_len" (uniform trailing
key padding: the keys past it are dropped, as USP does itself when no varlen metadata is published) and
"indices_k" (the flat valid key positions of xfuser's varlen metadata, read as a key mask where no
attn_mask comes with it) are honoured; the other keys configure other backends and are ignored, as
xfuser's SDPA and flash backends ignore them. Masks in ring attention are refused: xDiT passes each key
chunk with the whole mask.

Calls the 4-bit path cannot serve (dropout, fp64, ...) run torch's attention op that returns the lse
(CPU: any; CUDA: fp16 / bf16 without mask), counted by reason in `xdit_backend_stats`, warned once per
reason (`mxattention.FallbackWarning`) or refused with `strict=True`; where no such op exists the call
raises ValueError. Inference only: a backward raises `mxattention.InferenceOnlyError`.

torch.compile: each call is one opaque node, the custom op `mxattention::routed_sdpa` (see
`mxattention.ops`), which makes the policy's decision, counts and computes at run time; nothing is
wrapped in `torch.compiler.disable`. Policy: attach it to the xDiT transformer (`policy.attach(model)`);
each call of the function is decided and counted on its own, so a ring of N ranks counts N calls per
attention call on each rank; the chunks of one call share site, step and lengths, hence the decision.
Quantized methods quantize P~ against the running max of the keys seen, so ring results depend on the
split (PNQ row sums stay exactly one); Ulysses results do not. Q smoothing's correction qm K^T enters the
scores, and K smoothing's q . mean(K) is added back to the lse, so chunk lse values merge correctly.
"""

from __future__ import annotations

import re
import threading
from enum import Enum
from typing import Any

import torch

from mxattention.attention.config import AttentionConfig, get_method
from mxattention.attention.inputs import sdpa_problem
from mxattention.integrations._support import NamedBackend, add_enum_member, check_policy
from mxattention.integrations.policy import PrecisionPolicy
from mxattention.ops.call import routed_sdpa
from mxattention.ops.route import check_options, torch_attention_with_lse

DEFAULT_NAME = "MXATTENTION"
_NAME_RE = re.compile(r"^[A-Z][A-Z0-9_]*$")


def _xfuser_registry() -> Any:
    try:
        from xfuser.core.distributed import attention_backend
    except ImportError as e:
        raise ImportError("the xDiT backend needs xfuser (pip install xfuser; checked against 0.7.0)") from e
    return attention_backend


_lock = threading.Lock()
_registry: dict[str, NamedBackend] = {}


def xdit_backend_name(method: str | AttentionConfig) -> str:
    """The xDiT backend name of a method: the diffusers backend name upper-cased ("MXATTENTION",
    "MXATTENTION_PV8_SMOOTH", "MXATTENTION_FP", ...), as xfuser looks names up (`name.upper()`)."""
    name = get_method(method).name.replace("-", "_").upper()
    return name if name.startswith(DEFAULT_NAME) else f"{DEFAULT_NAME}_{name}"


def _enum_member(enum_cls: type[Enum], name: str) -> Enum:
    """The member `name` of xfuser's AttentionBackendType, added to the enum if missing."""
    if name in enum_cls._member_map_:
        return enum_cls[name]
    return add_enum_member(enum_cls, name, f"mxattention backend {name}", object.__new__(enum_cls))


def _keys_and_mask(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kwargs: dict | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(key, value, mask) of one call after xfuser's padding metadata (see the module docstring)."""
    if not kwargs:
        return key, value, None
    mask = kwargs.get("attn_mask")
    indices_k = kwargs.get("indices_k")
    if mask is None and indices_k is not None:
        b, _, sk, _ = key.shape
        mask = torch.zeros(b * sk, dtype=torch.bool, device=key.device)
        mask[indices_k] = True
        mask = mask.view(b, 1, 1, sk)
    valid = kwargs.get("valid_kv_len")
    if valid is not None and valid < key.shape[2]:
        if not 0 < valid:
            raise ValueError(f"attention_kwargs['valid_kv_len'] must be in [1, {key.shape[2]}], got {valid}")
        if mask is not None and mask.shape[-1] == key.shape[2]:
            mask = mask[..., :valid]
        key, value = key[:, :, :valid], value[:, :, :valid]
    if mask is not None and mask.dim() and mask.shape[-1] not in (1, key.shape[2]):
        raise ValueError(
            f"attn_mask covers {mask.shape[-1]} keys but this call has {key.shape[2]}: xDiT's ring attention "
            "passes each key chunk with the whole mask; use Ulysses (ring_degree=1) for masked attention"
        )
    return key, value, mask


def _attention(
    reg: NamedBackend,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float,
    is_causal: bool,
    attention_kwargs: dict | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    # Traced by Dynamo under torch.compile: static checks here, run-time decisions in the op.
    key, value, mask = _keys_and_mask(query, key, value, attention_kwargs)
    gqa = query.dim() == key.dim() == 4 and query.shape[1] != key.shape[1]
    reason = sdpa_problem(query, key, value, mask, dropout_p, is_causal, None, gqa)
    if reason is not None:
        reg.note_fallback(reason)
        pair = None if dropout_p != 0 else torch_attention_with_lse(query, key, value, mask, is_causal, None)
        if pair is None:
            raise ValueError(
                f"{reg.label} cannot serve this call ({reason}) and torch has no attention op returning "
                "the log-sum-exp xDiT's attention functions must return for it"
            )
        return pair
    site, step = reg.where()
    return routed_sdpa(query, key, value, mask, is_causal, None, gqa, True, reg.token, None, site, step)


def _backend_fn(name: str) -> Any:
    # xfuser's attention-function contract (`attention_backend.py`): [B, H, S, D] in, (out, lse) out.
    def mxattention_xdit(
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        attention_kwargs: dict | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return _attention(_registry[name], query, key, value, dropout_p, is_causal, attention_kwargs)

    mxattention_xdit.__qualname__ = mxattention_xdit.__name__ = f"mxattention_xdit[{name}]"
    return mxattention_xdit


def register_xdit_backend(
    method: str | AttentionConfig = "mxattention",
    name: str | None = None,
    policy: PrecisionPolicy | None = None,
    *,
    strict: bool = False,
) -> Enum:
    """Register (or re-point) the xDiT attention backend `name` running `method`; returns its
    `xfuser.core.distributed.attention_backend.AttentionBackendType` member.

    `name` defaults to `xdit_backend_name(method)`; upper-case letters, digits and '_' (xfuser upper-cases
    the names it is given). Calling again with the same method, policy object and `strict` does nothing;
    with others it re-points the name (and restarts its stats). `policy` keeps chosen calls in high
    precision; attach its hooks with `policy.attach(transformer)`. `strict=True` raises `FallbackError`
    instead of falling back to torch's attention.
    """
    cfg = get_method(method)
    check_policy(policy)
    check_options(strict, "error")
    name = xdit_backend_name(cfg) if name is None else name
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"backend name must be upper case letters, digits or '_', got {name!r}")
    ab = _xfuser_registry()
    enum_cls = ab.AttentionBackendType
    with _lock:
        old = _registry.get(name)
        if old is None and name in enum_cls._member_map_:
            raise ValueError(f"{name!r} is one of xfuser's own attention backends; choose another name")
        member = _enum_member(enum_cls, name)
        if old is not None and old.method == cfg and old.policy is policy and old.strict == strict:
            return member
        _registry[name] = NamedBackend(
            name, cfg, policy, label=f"mxattention xDiT backend {name!r}", strict=strict
        )
        if old is None:
            ab.register_attention_function(member)(_backend_fn(name))
    return member


def _get(name: str) -> NamedBackend:
    try:
        return _registry[name]
    except KeyError:
        raise ValueError(
            f"no mxattention xDiT backend named {name!r}; registered: {sorted(_registry)}"
        ) from None


def xdit_backend_stats(name: str = DEFAULT_NAME) -> dict[str, Any]:
    """Counts of the xDiT backend `name`: routed / high_precision / fallback (by reason) calls, masks
    seen as {(dtype, shape): calls}, and the method it runs."""
    reg = _get(name)
    return {**reg.calls.as_dict(), "method": reg.method.name}


def reset_xdit_backend_stats(name: str = DEFAULT_NAME) -> None:
    _get(name).calls.reset()
