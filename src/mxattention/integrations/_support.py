"""Internal: which SDPA calls the mxattention path can take, with a named reason when not.

Exposes `original_sdpa` (torch's function as found when this package was first imported, so the
high-precision and fallback paths never re-enter a patch), `unsupported_reason` and `CallStats`.
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F

original_sdpa = F.scaled_dot_product_attention

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def unsupported_reason(
    query: Any,
    key: Any,
    value: Any,
    attn_mask: Any,
    dropout_p: Any,
    is_causal: Any,
    scale: Any,
    enable_gqa: Any,
) -> str | None:
    """None if mxattention can run this [B, H, L, D] SDPA call, else a short reason for the fallback.

    Invalid calls also get a reason: the original SDPA then raises torch's own error for them.
    """
    tensors = (query, key, value)
    if torch.compiler.is_compiling():
        return "compiling"  # the reference is eager PyTorch; graphs keep torch's op
    if not all(type(t) in (torch.Tensor, torch.nn.Parameter) for t in tensors):
        return "tensor_type"  # non-tensors, DTensor, nested, fake and other subclasses
    if any(t.is_nested for t in tensors):
        return "tensor_type"
    if any(t.dim() != 4 for t in tensors):
        return "ndim"
    if any(t.dtype not in _FLOATS for t in tensors) or not (query.dtype == key.dtype == value.dtype):
        return "dtype"
    if not (query.device == key.device == value.device):
        return "device"
    if not isinstance(dropout_p, (int, float)) or dropout_p != 0.0:
        return "dropout"
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return "autograd"  # forward only: rounding would silently zero the gradients
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        return "scale"
    b, hq, lq, d = query.shape
    bk, hk, lk, dk = key.shape
    bv, hv, lv, _ = value.shape
    bad_heads = hq != hk and (not enable_gqa or hk == 0 or hq % hk)
    if (
        not (b == bk == bv)
        or dk != d
        or hk != hv
        or lk != lv
        or bad_heads
        or 0 in (*query.shape, *value.shape, lk)
    ):
        return "shape"
    if attn_mask is not None:
        if type(attn_mask) not in (torch.Tensor, torch.nn.Parameter) or is_causal:
            return "mask"
        if (
            attn_mask.dtype != torch.bool and attn_mask.dtype not in _FLOATS
        ) or attn_mask.device != query.device:
            return "mask"
        try:
            if torch.broadcast_shapes(attn_mask.shape, (b, hq, lq, lk)) != (b, hq, lq, lk):
                return "mask"
        except RuntimeError:
            return "mask"
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
