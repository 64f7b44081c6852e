"""Routers: the data a patch or a framework backend hands the op, and the decisions made from it.

Exposes `Router` (one patch or backend registration: method, policy, strict, autograd, counts; its
`token` is the string the ops take), `CallStats`, `lookup`, `original_sdpa` (torch's SDPA as found
when mxattention was first imported, so fallbacks never re-enter a patch), `torch_attention_with_lse`,
`tracks_grad`, `check_options`, the decisions `QUANTIZED` / `HIGH_NATIVE` / `HIGH_METHOD`,
`THREAD_SITE`, `computing()`, and two small ordered effectful ops beside the attention ops:

- `route_fallback` (`mxattention::route_fallback`): count, warn or (strict) raise for a call that
  runs torch's SDPA; traced code calls it next to the torch SDPA node it keeps.
- `route_decide` (`mxattention::route_decide`): the decision alone, for context parallelism, where
  one attention call runs the forward op once per key chunk and every chunk must use the same method.

The decision of an attention call (policy, counts) is made inside the attention op itself
(`ops.call.routed_sdpa`, `ops.call.varlen_op`) from the router its token names. A router's policy is
any object with `route_call(q_len, k_len, site, step) -> bool` (high precision?), `high_precision`
("native" or a method) and `high_precision_method`, as `integrations.PrecisionPolicy`.

Fallback warnings: once per reason per router, attributed to the user's line, naming the reason and
the fix (`errors.REASONS`).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F
from torch._library.effects import EffectType

from mxattention._callsite import warn_at_call_site
from mxattention.attention.config import AttentionConfig, get_method
from mxattention.attention.keys import method_key
from mxattention.ops.errors import REASONS, FallbackError, FallbackWarning

original_sdpa = F.scaled_dot_product_attention

AUTOGRAD = ("error", "torch")
# Decisions (the int8 value `route_decide` returns).
QUANTIZED, HIGH_NATIVE, HIGH_METHOD = 0, 1, 2
# A call's site argument when made eagerly: the policy reads this thread's site at run time.
THREAD_SITE = -1

_local = threading.local()


def computing() -> bool:
    """True while a routed op computes on this thread (a patch then passes SDPA calls straight on)."""
    return getattr(_local, "busy", False)


def tracks_grad(*tensors: torch.Tensor) -> bool:
    """True if autograd records this call: grad mode on and an input that requires grad."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def check_options(strict: object, autograd: object) -> None:
    """TypeError unless `strict` is a bool; ValueError unless `autograd` is one of AUTOGRAD."""
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be a bool, got {type(strict).__name__}")
    if autograd not in AUTOGRAD:
        raise ValueError(f"autograd must be one of {AUTOGRAD}, got {autograd!r}")


def torch_attention_with_lse(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """torch's own flash attention with its log-sum-exp, (O [B, H, Lq, Dv], lse [B, H, Lq] fp32), for
    [B, H, L, D] inputs with equal head counts; None where no such aten op serves the call.

    CPU: `_scaled_dot_product_flash_attention_for_cpu` (the kernel CPU SDPA runs; masks as additive
    in the query dtype). CUDA: `_scaled_dot_product_flash_attention`, fp16 / bf16, no mask, head dim
    a multiple of 8 up to 256.
    """
    if query.shape[1] != key.shape[1]:
        return None
    if query.device.type == "cpu":
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype).masked_fill(~attn_mask, -float("inf"))
        elif attn_mask is not None:
            attn_mask = attn_mask.to(query.dtype)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, is_causal, attn_mask=attn_mask, scale=scale
        )
        return out, lse.float()
    d = query.shape[-1]
    if (
        query.device.type == "cuda"
        and attn_mask is None
        and query.dtype in (torch.float16, torch.bfloat16)
        and d == value.shape[-1]
        and d % 8 == 0
        and d <= 256
    ):
        out, lse, *_ = torch.ops.aten._scaled_dot_product_flash_attention(
            query, key, value, dropout_p=0.0, is_causal=is_causal, return_debug_mask=False, scale=scale
        )
        return out, lse.float()
    return None


class CallStats:
    """Thread-safe counts of routed, high-precision and fallback calls (fallbacks by reason)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.routed = 0
        self.high_precision = 0
        self.fallback: Counter[str] = Counter()
        self.masks: Counter[tuple[str, tuple[int, ...]]] = Counter()

    def add(self, outcome: str, reason: str | None = None) -> None:
        with self._lock:
            if outcome == "routed":
                self.routed += 1
            elif outcome == "high_precision":
                self.high_precision += 1
            else:
                self.fallback[reason or "unknown"] += 1

    def saw_mask(self, mask: torch.Tensor | None) -> None:
        if mask is not None:
            with self._lock:
                self.masks[(str(mask.dtype).removeprefix("torch."), tuple(mask.shape))] += 1

    def reset(self) -> None:
        with self._lock:
            self.routed = self.high_precision = 0
            self.fallback.clear()
            self.masks.clear()

    def as_dict(self) -> dict[str, Any]:
        """{"routed", "high_precision", "fallback" (total), "fallback_reasons", "masks"}."""
        with self._lock:
            return {
                "routed": self.routed,
                "high_precision": self.high_precision,
                "fallback": sum(self.fallback.values()),
                "fallback_reasons": dict(self.fallback),
                "masks": dict(self.masks),
            }


_routers: weakref.WeakValueDictionary[str, Router] = weakref.WeakValueDictionary()
_ids = itertools.count()
_ids_lock = threading.Lock()


def lookup(token: str) -> Router:
    """The router a token names (RuntimeError if it is gone: a compiled graph outlived it)."""
    router = _routers.get(token)
    if router is None:
        raise RuntimeError(
            f"mxattention: the patch or backend {token!r} this call was routed through no longer exists "
            "(a compiled graph outlived it); compile the model again"
        )
    return router


class Router:
    """One patch or backend registration: method, policy, options and counts, named by `token`.

    Subclasses give `label` (how messages name it) and `native` (torch's SDPA as they reach it).
    The attention ops take the token (a constant of compiled graphs) and decide each call at run time.
    """

    label = "mxattention"

    def __init__(
        self,
        method: str | AttentionConfig,
        policy: Any,
        *,
        strict: bool = False,
        autograd: str = "error",
        sinks: tuple[CallStats, ...] = (),
    ) -> None:
        self.method = get_method(method)
        self.method_key = method_key(self.method)
        check_options(strict, autograd)
        self.policy = policy
        self.strict = strict
        self.autograd = autograd
        self.calls = CallStats()
        self._sinks = (self.calls, *sinks)
        self._warned: set[str] = set()
        self._warn_lock = threading.Lock()
        with _ids_lock:
            self.token = f"{type(self).__name__}:{next(_ids)}"
        _routers[self.token] = self

    def native(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None,
        is_causal: bool,
        scale: float | None,
        enable_gqa: bool,
    ) -> torch.Tensor:
        """torch's SDPA as this router reaches it (the function a patch replaced)."""
        return original_sdpa(
            query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )

    def _add(self, outcome: str, reason: str | None = None) -> None:
        for s in self._sinks:
            s.add(outcome, reason)

    def fallback(self, reason: str) -> None:
        """Count a call that runs torch's SDPA; warn once per reason, or raise with strict=True."""
        if reason == "autograd":  # chosen with autograd="torch": counted, neither warned nor refused
            self._add("fallback", reason)
            return
        what, fix = REASONS.get(reason, (reason, "see mxattention.patch_sdpa's documentation"))
        text = (
            f"{self.label}: a call ran torch's SDPA instead of the 4-bit path (reason {reason!r}: {what}); "
            f"fix: {fix}."
        )
        if self.strict:
            raise FallbackError(text + " (strict=True refuses fallbacks.)")
        self._add("fallback", reason)
        with self._warn_lock:
            new = reason not in self._warned
            self._warned.add(reason)
        if new:
            warn_at_call_site(
                text + " Counted in stats()['fallback_reasons']; warned once per reason; strict=True raises.",
                FallbackWarning,
            )

    def note_fallback(self, reason: str) -> None:
        """`fallback` from eager code; from traced code, through `route_fallback` at run time."""
        if torch.compiler.is_compiling():
            route_fallback(self.token, reason)
        else:
            self.fallback(reason)

    def where(self) -> tuple[int, torch.Tensor | None]:
        """(site, step) arguments of the ops for a call made here: while Dynamo traces, the graph's
        site (a constant) and the step tensor of this forward; eagerly, "read them at run time"."""
        if self.policy is not None and torch.compiler.is_compiling():
            return self.policy.traced_where()
        return THREAD_SITE, None

    def decide(
        self,
        q_len: int,
        k_len: int,
        attn_mask: torch.Tensor | None,
        site: int = THREAD_SITE,
        step: torch.Tensor | None = None,
    ) -> int:
        """QUANTIZED, HIGH_NATIVE or HIGH_METHOD for one call, counted (and the mask seen)."""
        for s in self._sinks:
            s.saw_mask(attn_mask)
        if self.policy is not None and self.policy.route_call(q_len, k_len, site, step):
            self._add("high_precision")
            return HIGH_NATIVE if self.policy.high_precision == "native" else HIGH_METHOD
        self._add("routed")
        return QUANTIZED


_TAGS = (torch.Tag.cudagraph_unsafe,)


@torch.library.custom_op("mxattention::route_fallback", mutates_args=(), tags=_TAGS)
def route_fallback(router: str, reason: str) -> None:
    """`Router.fallback` of the router `router`, at run time."""
    lookup(router).fallback(reason)


@route_fallback.register_fake
def _route_fallback_fake(router, reason):
    return None


@torch.library.custom_op("mxattention::route_decide", mutates_args=(), tags=_TAGS)
def route_decide(
    router: str,
    q_len: int,
    k_len: int,
    attn_mask: torch.Tensor | None,
    site: int = THREAD_SITE,
    step: torch.Tensor | None = None,
) -> torch.Tensor:
    """`Router.decide` at run time, as a 0-d int8 CPU tensor for `routed_sdpa`'s `decision`.
    Traced callers pass `*router.where()` (else a policy reads the thread's site at run time)."""
    return torch.tensor(lookup(router).decide(q_len, k_len, attn_mask, site, step), dtype=torch.int8)


@route_decide.register_fake
def _route_decide_fake(router, q_len, k_len, attn_mask, site=THREAD_SITE, step=None):
    return torch.empty((), dtype=torch.int8)


for _op in (route_fallback, route_decide):
    _op.register_effect(EffectType.ORDERED)
