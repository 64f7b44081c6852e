"""Route `torch.nn.functional.scaled_dot_product_attention` through mxattention.

Exposes `patch_sdpa` (a context manager), `enable` / `disable`, `stats` and `SdpaPatch`.

    with mxattention.patch_sdpa("mxattention") as patch:
        model(x)
    patch.stats()  # {"routed": ..., "high_precision": ..., "fallback": ..., "fallback_reasons": {...}}

Only the attribute on `torch.nn.functional` is replaced, so code that calls
`F.scaled_dot_product_attention` (or `torch.nn.functional.scaled_dot_product_attention`) at call time
is routed, including diffusers' "native" backend; code that bound the function earlier
(`from torch.nn.functional import scaled_dot_product_attention` at import) is not.

torch.compile: a model compiled (or re-traced) while the patch is installed traces the routing code;
each routed call is one opaque node, the custom op `mxattention::routed_sdpa` (`mxattention.ops`),
which decides (policy), counts and computes at run time, so `stats()` counts executed calls and the
output equals eager execution's. Dynamo guards on the patched attribute: outside the patch the model
recompiles with torch's SDPA.

Gradients: calls whose inputs require grad are quantized too (the forward is the same with or without
`torch.no_grad()`); a backward through a routed call raises `mxattention.InferenceOnlyError`.
`autograd="torch"` runs torch's SDPA for the calls that track gradients instead (counted as fallback
reason "autograd", neither warned nor refused by `strict`): the choice for training or fine-tuning.

Calls mxattention cannot serve run the function that was installed before the patch, counted by
reason: "dropout" (dropout_p != 0, training), "dtype", "ndim", "device", "tensor_type" (tensor
subclasses, nested tensors), "shape", "mask" (also invalid calls: torch then raises its own error),
"scale". Each reason warns once per patch (`mxattention.FallbackWarning`, naming the reason and the
fix, attributed to the caller's line); `strict=True` raises `mxattention.FallbackError` instead.
A `PrecisionPolicy` may keep a call in high precision: with `high_precision="native"` (its default)
that is the function installed before the patch, i.e. torch's own SDPA; otherwise the policy's
full-precision mxattention method.

Thread safety: the patch is process-wide (a module attribute), so while it is active every thread's
calls are routed; install and removal are serialized by a lock and the counters are locked. Entering
and leaving patches from several threads at once is safe but only LIFO order per thread restores
the attribute immediately: a patch left out of order turns into a pass-through until the patches
above it are left. Calls made while mxattention itself is computing (on this thread) go straight to
the previous function, so the patch never re-enters itself.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.nn.functional as F

from mxattention.attention.config import AttentionConfig
from mxattention.attention.inputs import sdpa_problem
from mxattention.integrations._support import check_policy
from mxattention.integrations.policy import PrecisionPolicy
from mxattention.ops.call import routed, routed_replay, routed_sdpa
from mxattention.ops.memo import signature
from mxattention.ops.route import THREAD_SITE, CallStats, Router, computing, tracks_grad

_lock = threading.RLock()
_stack: list[SdpaPatch] = []  # installed patches, innermost last
_enabled: list[SdpaPatch] = []  # patches entered by enable(), for disable()
_totals = CallStats()


class SdpaPatch(Router):
    """One installation of the routing wrapper; a context manager, re-usable but not re-entrant."""

    def __init__(
        self,
        method: str | AttentionConfig = "mxattention",
        policy: PrecisionPolicy | None = None,
        *,
        strict: bool = False,
        autograd: str = "error",
    ) -> None:
        check_policy(policy)
        super().__init__(method, policy, strict=strict, autograd=autograd, sinks=(_totals,))
        self.label = f"mxattention.patch_sdpa({self.method.name!r})"
        self._prev: Any = None
        self._active = False
        self._fn = self._make_fn()

    @property
    def active(self) -> bool:
        return self._active

    def stats(self) -> dict[str, Any]:
        """Calls seen while this patch was the innermost: routed / high_precision / fallback counts."""
        return self.calls.as_dict()

    def __enter__(self) -> SdpaPatch:
        with _lock:
            if self._active or self in _stack:
                raise RuntimeError("this SdpaPatch is already installed; create a new one to nest")
            self._prev = F.scaled_dot_product_attention
            F.scaled_dot_product_attention = self._fn
            self._active = True
            _stack.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        with _lock:
            self._active = False
            # Unwind from the top every patch already left, restoring exactly what each replaced.
            while _stack and not _stack[-1]._active and F.scaled_dot_product_attention is _stack[-1]._fn:
                F.scaled_dot_product_attention = _stack.pop()._prev

    def _make_fn(self) -> Any:
        def scaled_dot_product_attention(
            query: torch.Tensor,
            key: torch.Tensor,
            value: torch.Tensor,
            attn_mask: torch.Tensor | None = None,
            dropout_p: float = 0.0,
            is_causal: bool = False,
            scale: float | None = None,
            enable_gqa: bool = False,
        ) -> torch.Tensor:
            return self._call(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)

        scaled_dot_product_attention.__doc__ = (
            f"torch SDPA routed through mxattention ({self.method.describe()}); see mxattention.patch_sdpa."
        )
        return scaled_dot_product_attention

    def native(self, query, key, value, attn_mask, is_causal, scale, enable_gqa) -> torch.Tensor:
        kw = {"attn_mask": attn_mask, "is_causal": is_causal, "scale": scale}
        return self._prev(query, key, value, **kw, **({"enable_gqa": True} if enable_gqa else {}))

    def _call(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        # Traced by Dynamo under torch.compile: the checks below are static facts of the call (they
        # become guards); every decision that depends on run-time state happens in the ops.
        args = (query, key, value)
        kw = {"attn_mask": attn_mask, "dropout_p": dropout_p, "is_causal": is_causal, "scale": scale}
        if enable_gqa:
            kw["enable_gqa"] = True
        # SDPA calls made while mxattention computes (`ops.route.computing`) go to the previous function.
        if not self._active or (not torch.compiler.is_compiling() and computing()):
            return self._prev(*args, **kw)
        # A call like one the kernels served before: decided, counted and replayed (`ops.memo`).
        sig = signature(self.token, query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        decision, pair = routed_replay(
            self.token, sig, (query, key, value, attn_mask), query.shape[-2], key.shape[-2], attn_mask
        )
        if pair is not None:
            return pair[0]
        reason = sdpa_problem(*args, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        if reason is None and self.autograd == "torch" and tracks_grad(*args):
            reason = "autograd"
        if reason is not None:
            self.note_fallback(reason)
            return self._prev(*args, **kw)
        scale_ = None if scale is None else float(scale)
        if sig is not None:  # a plain eager call (`memo.signature`): the op's body without its dispatch
            out, _ = routed(
                query, key, value, attn_mask, is_causal, scale_, enable_gqa, False, self.token, decision,
                THREAD_SITE, None, sig,
            )  # fmt: skip
            return out
        site, step = self.where()
        out, _ = routed_sdpa(
            query, key, value, attn_mask, is_causal, scale_, enable_gqa, False, self.token, None, site, step
        )
        return out


def patch_sdpa(
    method: str | AttentionConfig = "mxattention",
    policy: PrecisionPolicy | None = None,
    *,
    strict: bool = False,
    autograd: str = "error",
) -> SdpaPatch:
    """A context manager routing torch's SDPA through mxattention's `method` (see the module docstring).

    While active, every call of `torch.nn.functional.scaled_dot_product_attention` made at call time
    with [B, H, L, D] fp32 / fp16 / bf16 tensors runs `mxattention.scaled_dot_product_attention` with
    `method` (a preset name or `AttentionConfig`): the fused kernels on CUDA where they compute the
    method, else the PyTorch reference (CPU included, with a `ReferenceFallbackWarning` once per
    reason). `policy` (a `PrecisionPolicy`) keeps chosen calls in high precision. The patch's
    `stats()` counts routed / high-precision / fallback calls (fallbacks by reason) and masks seen.

    Calls the 4-bit path cannot serve (dropout, another dtype, not 4-D, devices that differ, tensor
    subclasses, bad shapes or masks, a non-number scale) run the function installed before the patch,
    counted, with a `FallbackWarning` once per reason; `strict=True` raises `FallbackError` instead.
    `autograd`: "error" (default) quantizes calls that track gradients too, and a backward through them
    raises `InferenceOnlyError`; "torch" runs torch's SDPA for those calls. Raises ValueError for an
    unknown preset or `autograd`, TypeError for a `strict` that is not a bool, a `policy` that is not
    a PrecisionPolicy or a `method` of another type; entering the same patch twice raises RuntimeError.
    """
    return SdpaPatch(method, policy, strict=strict, autograd=autograd)


def enable(
    method: str | AttentionConfig = "mxattention",
    policy: PrecisionPolicy | None = None,
    *,
    strict: bool = False,
    autograd: str = "error",
) -> SdpaPatch:
    """Install a patch until `disable()`, without a `with` block; returns it (for its `stats()`).

    Arguments, where it runs and what raises: as `patch_sdpa`. Patches nest: the latest `enable()`
    is the one `disable()` removes.
    """
    patch = SdpaPatch(method, policy, strict=strict, autograd=autograd)
    patch.label = f"mxattention.enable({patch.method.name!r})"
    patch.__enter__()
    with _lock:
        _enabled.append(patch)
    return patch


def disable() -> dict[str, Any]:
    """Remove the most recent `enable()` patch and return its stats: {"routed", "high_precision",
    "fallback", "fallback_reasons", "masks"}. Raises RuntimeError if no `enable()` patch is active."""
    with _lock:
        if not _enabled:
            raise RuntimeError("mxattention.disable(): no patch enabled by mxattention.enable()")
        patch = _enabled.pop()
    patch.__exit__(None, None, None)
    return patch.stats()


def stats(reset: bool = False) -> dict[str, Any]:
    """Counts over every patch since import (or the last reset): routed / high_precision / fallback."""
    out = _totals.as_dict()
    if reset:
        _totals.reset()
    return out
