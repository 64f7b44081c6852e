"""Argument checks of the SDPA-compatible entry point, done once at the boundary.

Every error names the argument and says what was expected; nothing is reshaped or converted
silently (the only conversion is the exact upcast of fp16 / bf16 operands to fp32 inside).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class Shapes:
    batch: int
    q_heads: int
    kv_heads: int
    q_len: int
    kv_len: int
    head_dim: int
    v_dim: int

    @property
    def empty(self) -> bool:
        """A zero-size dim: the result is empty, or with no keys O = 0 and lse = -inf, or with
        head_dim 0 every score 0 (as torch SDPA: O = the mean of V^)."""
        return 0 in (
            self.batch,
            self.q_heads,
            self.kv_heads,
            self.q_len,
            self.kv_len,
            self.head_dim,
            self.v_dim,
        )

    def default_scale(self) -> float:
        """torch's 1/sqrt(head_dim); with head_dim 0 every score is 0 under any scale."""
        return 1.0 / math.sqrt(self.head_dim) if self.head_dim else 1.0


def check_operands(named: tuple[tuple[str, object], ...], layout: str) -> tuple[torch.Tensor, ...]:
    """The three operands `(name, tensor)` checked alike: tensors of one float dtype on one device,
    each of rank len(layout) (`layout` names the axes, e.g. ("batch", "heads", "seq_len", "head_dim"))."""
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _FLOATS:
            raise TypeError(f"{name} must be float32, float16 or bfloat16, got {t.dtype}")
        if t.dim() != len(layout):
            raise ValueError(
                f"{name} must be {len(layout)}-D [{', '.join(layout)}], got shape {tuple(t.shape)}"
            )
    (a, ta), (b, tb), (c, tc) = named
    assert isinstance(ta, torch.Tensor) and isinstance(tb, torch.Tensor) and isinstance(tc, torch.Tensor)
    if not (ta.dtype == tb.dtype == tc.dtype):
        raise TypeError(f"{a}, {b} and {c} must share one dtype, got {ta.dtype}, {tb.dtype}, {tc.dtype}")
    if not (ta.device == tb.device == tc.device):
        raise ValueError(f"{a}, {b} and {c} must be on one device, got {ta.device}, {tb.device}, {tc.device}")
    return ta, tb, tc


def check_qkv(query: object, key: object, value: object, enable_gqa: bool) -> Shapes:
    query, key, value = check_operands(
        (("query", query), ("key", key), ("value", value)), ("batch", "heads", "seq_len", "head_dim")
    )
    b, hq, lq, d = query.shape
    bk, hk, lk, dk = key.shape
    bv, hv, lv, dv = value.shape
    if not (b == bk == bv):
        raise ValueError(f"batch sizes differ: query {b}, key {bk}, value {bv}")
    if dk != d:
        raise ValueError(f"key head_dim {dk} must equal query head_dim {d}")
    if hk != hv:
        raise ValueError(f"key and value must have the same number of heads, got {hk} and {hv}")
    if lk != lv:
        raise ValueError(f"key and value must have the same seq_len, got {lk} and {lv}")
    if hq != hk:
        if hk == 0:
            raise ValueError(f"key/value have 0 heads but query has {hq}")
        if not enable_gqa:
            raise ValueError(
                f"query has {hq} heads and key/value {hk}: pass enable_gqa=True for grouped-query attention"
            )
        if hq % hk:
            raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hk}) for GQA")
    # Zero-size dims are accepted, as torch SDPA accepts them: see `Shapes.empty`.
    return Shapes(b, hq, hk, lq, lk, d, dv)


def check_mask(
    attn_mask: object, shapes: Shapes, query: torch.Tensor, is_causal: bool
) -> torch.Tensor | None:
    """The mask as a view broadcast to [B, H, Lq, Lk] (bool, True = attend, or float additive)."""
    if attn_mask is None:
        return None
    if not isinstance(attn_mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(attn_mask).__name__}")
    if is_causal:
        raise ValueError("pass either attn_mask or is_causal=True, not both (as torch SDPA)")
    if attn_mask.dtype != torch.bool and attn_mask.dtype not in _FLOATS:
        raise TypeError(
            f"attn_mask must be bool (True = attend) or a float additive mask, got {attn_mask.dtype}"
        )
    if attn_mask.device != query.device:
        raise ValueError(f"attn_mask is on {attn_mask.device} but query is on {query.device}")
    target = (shapes.batch, shapes.q_heads, shapes.q_len, shapes.kv_len)
    if attn_mask.dim() > 4:
        raise ValueError(
            f"attn_mask must have at most 4 dims broadcastable to {target}, got {tuple(attn_mask.shape)}"
        )
    try:
        return attn_mask.expand(target)
    except RuntimeError:
        raise ValueError(
            f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to [B, H, Lq, Lk] = {list(target)}"
        ) from None


def check_scalars(dropout_p: object, scale: object) -> None:
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p must be 0 (MX attention is inference-only), got {dropout_p!r}")
    if scale is not None and not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
