"""Route `torch.nn.functional.scaled_dot_product_attention` through mxattention.

Exposes `patch_sdpa` (a context manager), `enable` / `disable`, `stats` and `SdpaPatch`.

    with mxattention.patch_sdpa("mxattention") as patch:
        model(x)
    patch.stats()  # {"routed": ..., "high_precision": ..., "fallback": ..., "fallback_reasons": {...}}

Only the attribute on `torch.nn.functional` is replaced, so code that calls
`F.scaled_dot_product_attention` (or `torch.nn.functional.scaled_dot_product_attention`) at call time
is routed, including diffusers' "native" backend; code that bound the function earlier
(`from torch.nn.functional import scaled_dot_product_attention` at import) is not.

Calls mxattention cannot serve run the function that was installed before the patch, counted by
reason: "dropout" (dropout_p != 0, training), "autograd" (inputs need gradients), "dtype", "ndim",
"device", "tensor_type" (tensor subclasses, nested tensors), "shape", "mask" (also invalid calls: torch
then raises its own error), "scale", "compiling" (inside torch.compile, graphs keep torch's op).
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

from mxattention.attention.config import AttentionConfig, get_method
from mxattention.dispatch import scaled_dot_product_attention as mx_sdpa
from mxattention.integrations._support import CallStats, unsupported_reason
from mxattention.integrations.policy import NATIVE, PrecisionPolicy

_lock = threading.RLock()
_stack: list[SdpaPatch] = []  # installed patches, innermost last
_enabled: list[SdpaPatch] = []  # patches entered by enable(), for disable()
_totals = CallStats()
_local = threading.local()


def _busy() -> bool:
    return getattr(_local, "busy", False)


class SdpaPatch:
    """One installation of the routing wrapper; a context manager, re-usable but not re-entrant."""

    def __init__(
        self, method: str | AttentionConfig = "mxattention", policy: PrecisionPolicy | None = None
    ) -> None:
        self.method = get_method(method)
        if policy is not None and not isinstance(policy, PrecisionPolicy):
            raise TypeError(f"policy must be a PrecisionPolicy or None, got {type(policy).__name__}")
        self.policy = policy
        self._stats = CallStats()
        self._prev: Any = None
        self._active = False
        self._fn = self._make_fn()

    @property
    def active(self) -> bool:
        return self._active

    def stats(self) -> dict[str, Any]:
        """Calls seen while this patch was the innermost: routed / high_precision / fallback counts."""
        return self._stats.as_dict()

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

    def _count(self, outcome: str, reason: str | None = None) -> None:
        self._stats.add(outcome, reason)
        _totals.add(outcome, reason)

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
        args = (query, key, value)
        kw = {"attn_mask": attn_mask, "dropout_p": dropout_p, "is_causal": is_causal, "scale": scale}
        if enable_gqa:
            kw["enable_gqa"] = True
        if not self._active or _busy():
            return self._prev(*args, **kw)
        _local.busy = True
        try:
            reason = unsupported_reason(*args, attn_mask, dropout_p, is_causal, scale, enable_gqa)
            if reason is not None:
                self._count("fallback", reason)
                return self._prev(*args, **kw)
            self._stats.saw_mask(attn_mask)
            _totals.saw_mask(attn_mask)
            method = self.method
            if self.policy is not None and self.policy.route(query.shape[-2], key.shape[-2]):
                self._count("high_precision")
                if self.policy.high_precision == NATIVE:
                    return self._prev(*args, **kw)
                method = self.policy.high_precision_method
            else:
                self._count("routed")
            return mx_sdpa(query, key, value, attn_mask, 0.0, is_causal, scale, enable_gqa, method=method)  # type: ignore[return-value]
        finally:
            _local.busy = False


def patch_sdpa(
    method: str | AttentionConfig = "mxattention", policy: PrecisionPolicy | None = None
) -> SdpaPatch:
    """A context manager routing torch's SDPA through mxattention's `method` (see the module docstring)."""
    return SdpaPatch(method, policy)


def enable(method: str | AttentionConfig = "mxattention", policy: PrecisionPolicy | None = None) -> SdpaPatch:
    """Install a patch until `disable()`; returns it (for its `stats()`)."""
    patch = SdpaPatch(method, policy).__enter__()
    with _lock:
        _enabled.append(patch)
    return patch


def disable() -> dict[str, Any]:
    """Remove the most recent `enable()` patch; returns its stats. RuntimeError if none is enabled."""
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
