"""Internal: which SDPA calls the mxattention path can take, with a named reason when not.

Exposes `original_sdpa` (torch's function as found when this package was first imported, so the
high-precision and fallback paths never re-enter a patch), `torch_attention_with_lse`,
`unsupported_reason`, `CallStats` and `add_enum_member` (a member added to a framework's live backend Enum).
"""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F

from mxattention.attention.inputs import _FLOATS

original_sdpa = F.scaled_dot_product_attention


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
    Traceable by Dynamo without graph breaks: under torch.compile these are static facts of the call.
    Inputs that require grad are served (see `_routing.tracks_grad` for the autograd="torch" choice).
    """
    tensors = (query, key, value)
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
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        return "scale"
    b, hq, lq, d = query.shape
    bk, hk, lk, dk = key.shape
    bv, hv, lv, _ = value.shape
    bad_heads = hq != hk and (not enable_gqa or hk == 0 or hq % hk)
    # Zero-size dims are valid and served, as the public entry serves them (`attention.inputs.
    # check_qkv`, `Shapes.empty`): torch SDPA's result, not a fallback.
    if not (b == bk == bv) or dk != d or hk != hv or lk != lv or bad_heads:
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


def add_enum_member(enum_cls: type, attr: str, value: Any, member: Any) -> Any:
    """Add `member` (made by the enum's own base: `str.__new__`, `object.__new__`) to the live Enum
    `enum_cls` as `enum_cls.<attr>` with value `value`, the way the Enum machinery records its own
    members (frameworks key their attention registries by such enums; both backends extend one)."""
    member._name_ = attr
    member._value_ = value
    member.__objclass__ = enum_cls
    if hasattr(enum_cls, "_add_member_"):  # Python >= 3.13 keeps the member bookkeeping itself
        enum_cls._add_member_(attr, member)
    else:
        member._sort_order_ = len(enum_cls._member_names_)
        enum_cls._member_map_[attr] = member
        enum_cls._member_names_.append(attr)
        type.__setattr__(enum_cls, attr, member)
    enum_cls._value2member_map_[value] = member
    return member
