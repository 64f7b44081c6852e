"""Internal: the run-time side of a patch or a diffusers backend, eager and inside compiled graphs.

Exposes `Router` (the base of `SdpaPatch` and the diffusers backend's registrations), `FallbackError`,
`FallbackWarning`, `tracks_grad`, `check_options`, and three custom ops, which eager calls run too:

- `routed_sdpa` (`mxattention::routed_sdpa`): one attention call of the router a string token names:
  the policy's decision, the counts, then the quantized method, the high-precision method or torch's
  SDPA, all at run time. A compiled graph holds one opaque node per call; its counts are of executed
  calls, not traces, and the policy sees each run's step and block.
- `route_fallback` (`mxattention::route_fallback`): count, warn or (strict) raise for a call that
  runs torch's SDPA; traced code calls it next to the torch SDPA node it keeps.
- `route_decide` (`mxattention::route_decide`): the decision alone, for context parallelism, where
  one attention call runs the forward op once per key chunk and every chunk must use the same method.

All three are ordered effectful ops (torch.library's effects), so compiled graphs never drop them
(their counts are side effects). Their order against the policy's hooks is kept by data, not by the
effect (Inductor hoists side-effect-only ops): a compiled call passes its site as a constant and takes
the step tensor of `mxattention::policy_model_call` as an input (see `policy`). They are tagged
cudagraph-unsafe: their Python state changes on every run. `routed_sdpa`'s backward raises
`InferenceOnlyError` (see `kernels.op`).

Fallback warnings: once per reason per router (patch or backend registration), attributed to the
user's line (the model call, or the user's own SDPA call), naming the reason and the fix.
"""

from __future__ import annotations

import itertools
import threading
import weakref

import torch
from torch._library.effects import EffectType

from mxattention._callsite import warn_at_call_site
from mxattention.attention.config import AttentionConfig, get_method
from mxattention.dispatch import scaled_dot_product_attention as mx_sdpa
from mxattention.integrations._support import CallStats, original_sdpa, torch_attention_with_lse
from mxattention.integrations.policy import (
    _UNSET,
    NATIVE,
    THREAD_SITE,
    PrecisionPolicy,
    site_of,
    traced_site,
    traced_step,
)
from mxattention.kernels.op import register_inference_only

AUTOGRAD = ("error", "torch")

# Decisions (the int8 value `route_decide` returns).
QUANTIZED, HIGH_NATIVE, HIGH_METHOD = 0, 1, 2

# reason -> (what happened, how to get the call quantized)
REASONS: dict[str, tuple[str, str]] = {
    "dropout": ("dropout_p > 0", "put the model in eval mode (model.eval()) for inference"),
    "dtype": (
        "inputs not all of one dtype among fp32 / fp16 / bf16",
        "cast query, key and value to one of fp32, fp16, bf16",
    ),
    "ndim": ("inputs not 4-D [B, H, L, D]", "pass 4-D query, key and value"),
    "device": ("query, key and value on different devices", "move them to one device"),
    "tensor_type": (
        "tensor subclass (DTensor, nested or fake tensor, ...)",
        "pass plain tensors (for sharded sequences use diffusers' context parallelism with the "
        "mxattention backend)",
    ),
    "shape": (
        "shapes that disagree",
        "check the call (torch's SDPA raises its own error for invalid shapes)",
    ),
    "mask": (
        "a mask of another dtype or device, not broadcastable to [B, H, Lq, Lk], or given with "
        "is_causal=True",
        "pass a bool or float mask on the inputs' device, or is_causal without a mask",
    ),
    "scale": ("scale not a Python number", "pass scale as a float or None"),
    "autograd": ("inputs that require grad, with autograd='torch'", "chosen: not a fallback to fix"),
}


class FallbackError(RuntimeError):
    """strict=True: a call the 4-bit path cannot serve would have run torch's SDPA."""


class FallbackWarning(UserWarning):
    """A call the 4-bit path cannot serve ran torch's SDPA (warned once per reason per patch / backend)."""


def tracks_grad(*tensors: torch.Tensor) -> bool:
    """True if autograd records this call: grad mode on and an input that requires grad."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def check_options(strict: object, autograd: object) -> None:
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be a bool, got {type(strict).__name__}")
    if autograd not in AUTOGRAD:
        raise ValueError(f"autograd must be one of {AUTOGRAD}, got {autograd!r}")


_routers: weakref.WeakValueDictionary[str, Router] = weakref.WeakValueDictionary()
_ids = itertools.count()
_ids_lock = threading.Lock()


def _lookup(token: str) -> Router:
    router = _routers.get(token)
    if router is None:
        raise RuntimeError(
            f"mxattention: the patch or backend {token!r} this call was routed through no longer exists "
            "(a compiled graph outlived it); compile the model again"
        )
    return router


class Router:
    """One patch or backend registration: method, policy, options, counts; decides each call at run time.

    Subclasses give `label` (how messages name it) and `native` (torch's SDPA as they reach it).
    `token` names it in the custom ops' string argument (a constant of compiled graphs).
    """

    label = "mxattention"

    def __init__(
        self,
        method: str | AttentionConfig,
        policy: PrecisionPolicy | None,
        *,
        strict: bool = False,
        autograd: str = "error",
        sinks: tuple[CallStats, ...] = (),
    ) -> None:
        self.method = get_method(method)
        if policy is not None and not isinstance(policy, PrecisionPolicy):
            raise TypeError(f"policy must be a PrecisionPolicy or None, got {type(policy).__name__}")
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

    # ---- what subclasses provide -----------------------------------------------------------------

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
        raise NotImplementedError

    # ---- counting, fallbacks and decisions (run time) --------------------------------------------

    def _add(self, outcome: str, reason: str | None = None) -> None:
        for s in self._sinks:
            s.add(outcome, reason)

    def _saw_mask(self, mask: torch.Tensor | None) -> None:
        for s in self._sinks:
            s.saw_mask(mask)

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
            return traced_site(), traced_step(self.policy)
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
        self._saw_mask(attn_mask)
        step_ = _UNSET if step is None else int(step) if int(step) >= 0 else None
        if self.policy is not None and self.policy.route(q_len, k_len, site=site_of(site), step=step_):
            self._add("high_precision")
            return HIGH_NATIVE if self.policy.high_precision == NATIVE else HIGH_METHOD
        self._add("routed")
        return QUANTIZED

    def run(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None,
        is_causal: bool,
        scale: float | None,
        enable_gqa: bool,
        return_lse: bool,
        decision: int | None,
        site: int = THREAD_SITE,
        step: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(O [B, Hq, Lq, Dv], lse [B, Hq, Lq] fp32, or empty without `return_lse`) of one call."""
        if decision is None:
            decision = self.decide(query.shape[-2], key.shape[-2], attn_mask, site, step)
        no_lse = query.new_empty((0,), dtype=torch.float32)
        if decision == HIGH_NATIVE and not return_lse:
            out = self.native(query, key, value, attn_mask, is_causal, scale, enable_gqa)
            return out.contiguous(), no_lse
        pair = None
        if decision == QUANTIZED:
            cfg = self.method
        elif decision == HIGH_METHOD:
            cfg = self.policy.high_precision_method if self.policy is not None else get_method("fp")
        else:  # native with its log-sum-exp: torch's flash op where one serves the call, else "fp"
            cfg = get_method("fp")
            pair = torch_attention_with_lse(query, key, value, attn_mask, is_causal, scale)
        if pair is None:
            pair = mx_sdpa(
                query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa, method=cfg, return_lse=True
            )
        out, lse = pair
        return out.contiguous(), lse.contiguous() if return_lse else no_lse


# ---- the custom ops ------------------------------------------------------------------------------

_TAGS = (torch.Tag.cudagraph_unsafe,)


class NamedBackend(Router):
    """A backend registered under a name by a framework (diffusers, xDiT): its method, policy,
    options and counts; the calls it does not quantize run torch's own SDPA."""

    def __init__(
        self,
        name: str,
        method: AttentionConfig,
        policy: PrecisionPolicy | None,
        *,
        label: str,
        strict: bool = False,
        autograd: str = "error",
    ) -> None:
        super().__init__(method, policy, strict=strict, autograd=autograd)
        self.name = name
        self.label = label

    def native(self, query, key, value, attn_mask, is_causal, scale, enable_gqa) -> torch.Tensor:
        return original_sdpa(
            query, key, value, attn_mask=attn_mask, is_causal=is_causal, scale=scale, enable_gqa=enable_gqa
        )


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
    site: int = THREAD_SITE,
    step: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One call of the router `router` ([B, H, L, D] inputs); `decision` (from `route_decide`) or None
    to decide here, with the policy's `site` and `step` (see `Router.where`). Returns (O, lse) as
    `Router.run`."""
    d = None if decision is None else int(decision)
    return _lookup(router).run(
        query, key, value, attn_mask, is_causal, scale, enable_gqa, return_lse, d, site, step
    )


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
    site=THREAD_SITE,
    step=None,
):
    b, hq, lq, _ = query.shape
    lse_shape = (b, hq, lq) if return_lse else (0,)
    return query.new_empty((b, hq, lq, value.shape[-1])), query.new_empty(lse_shape, dtype=torch.float32)


@torch.library.custom_op("mxattention::route_fallback", mutates_args=(), tags=_TAGS)
def route_fallback(router: str, reason: str) -> None:
    """`Router.fallback` of the router `router`, at run time."""
    _lookup(router).fallback(reason)


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
    return torch.tensor(_lookup(router).decide(q_len, k_len, attn_mask, site, step), dtype=torch.int8)


@route_decide.register_fake
def _route_decide_fake(router, q_len, k_len, attn_mask, site=THREAD_SITE, step=None):
    return torch.empty((), dtype=torch.int8)


for _op in (routed_sdpa, route_fallback, route_decide):
    _op.register_effect(EffectType.ORDERED)
register_inference_only(routed_sdpa, "mxattention (patched attention)")
