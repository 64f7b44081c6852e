"""The one validator of an SDPA-shaped call: a clear error, or the name of the reason to fall back.

Exposes `sdpa_problem` (None if mxattention serves the call, else a reason of `REASON_NAMES`; with
`raises=True` the TypeError / ValueError naming the argument instead), `check_sdpa` (the public
entry's form: raises, returns the scale to use), `check_operands` (the operand checks the varlen
entry shares) and `check_scale`. Every error names the argument and says what was expected; nothing
is reshaped or converted silently.

Zero-size dimensions are decided here, once: they are valid (as torch SDPA accepts them) and served,
not fallbacks; the result is empty, or with no keys O = 0 and lse = -inf, or with head_dim 0 every
score 0 (O = the mean of V^). Only "0 key/value heads for query heads" is an error (no group).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

_FLOATS = (torch.float32, torch.float16, torch.bfloat16)
_PLAIN = (torch.Tensor, torch.nn.Parameter)
_LAYOUT = ("batch", "heads", "seq_len", "head_dim")

# The reasons `sdpa_problem` returns (the fallback table, `mxattention.ops.errors.REASONS`, explains
# each one and its fix).
REASON_NAMES = ("tensor_type", "dtype", "ndim", "device", "dropout", "scale", "shape", "mask")


def _problem(reason: str, exc: type[Exception], text: Callable[[], str], raises: bool) -> str:
    # The message is built only where it is raised: traced callers (the patch, the backends) only
    # take the reason, and Dynamo then never formats a message.
    if raises:
        raise exc(text())
    return reason


def _operand_problem(name: str, t: object, layout: tuple[str, ...], plain: bool, raises: bool) -> str | None:
    if not isinstance(t, torch.Tensor) or (plain and (type(t) not in _PLAIN or t.is_nested)):
        got = type(t).__name__ if not isinstance(t, torch.Tensor) or not t.is_nested else "a nested tensor"
        return _problem(
            "tensor_type",
            TypeError,
            lambda: f"{name} must be a torch.Tensor (not a subclass), got {got}",
            raises,
        )
    if t.dtype not in _FLOATS:
        return _problem(
            "dtype", TypeError, lambda: f"{name} must be float32, float16 or bfloat16, got {t.dtype}", raises
        )
    if t.dim() != len(layout):
        return _problem(
            "ndim",
            ValueError,
            lambda: f"{name} must be {len(layout)}-D [{', '.join(layout)}], got shape {tuple(t.shape)}",
            raises,
        )
    return None


def _shared_problem(named: tuple[tuple[str, torch.Tensor], ...], raises: bool) -> str | None:
    (a, ta), (b, tb), (c, tc) = named
    if not (ta.dtype == tb.dtype == tc.dtype):
        return _problem(
            "dtype",
            TypeError,
            lambda: f"{a}, {b} and {c} must share one dtype, got {ta.dtype}, {tb.dtype}, {tc.dtype}",
            raises,
        )
    if not (ta.device == tb.device == tc.device):
        return _problem(
            "device",
            ValueError,
            lambda: f"{a}, {b} and {c} must be on one device, got {ta.device}, {tb.device}, {tc.device}",
            raises,
        )
    return None


def _scale_problem(scale: object, raises: bool) -> str | None:
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        return _problem(
            "scale", TypeError, lambda: f"scale must be a float or None, got {type(scale).__name__}", raises
        )
    return None


def check_operands(
    named: tuple[tuple[str, object], ...], layout: tuple[str, ...]
) -> tuple[torch.Tensor, ...]:
    """The three operands `(name, tensor)` checked alike: tensors of one float dtype on one device,
    each of rank len(layout) (`layout` names the axes, e.g. ("batch", "heads", "seq_len", "head_dim"))."""
    for name, t in named:
        _operand_problem(name, t, layout, False, True)
    _shared_problem(named, True)  # type: ignore[arg-type]
    return tuple(t for _, t in named)  # type: ignore[misc]


def check_scale(scale: object) -> None:
    """TypeError unless `scale` is a Python number (not a bool) or None."""
    _scale_problem(scale, True)


def sdpa_problem(
    query: object,
    key: object,
    value: object,
    attn_mask: object,
    dropout_p: object,
    is_causal: object,
    scale: object,
    enable_gqa: object,
    *,
    raises: bool = False,
) -> str | None:
    """None if mxattention serves this [B, H, L, D] SDPA call, else the reason it cannot (a name of
    `REASON_NAMES`), or with `raises=True` the error naming the argument (TypeError / ValueError).

    One order of checks for both uses: each operand (a plain tensor, a float dtype, 4-D), then one
    dtype, one device, dropout 0, the scale a number, shapes that agree (GQA needs `enable_gqa` and
    a multiple), then the mask (bool or float, the inputs' device, broadcastable to [B, Hq, Lq, Lk],
    not with `is_causal`). Traceable by Dynamo without graph breaks where it does not raise (under
    torch.compile these are static facts of the call). Tensors that require grad are served. Tensor
    subclasses (DTensor, nested or fake tensors) are reason "tensor_type" for the callers that have
    torch's SDPA to fall back on; the raising entry passes them on to its op (fake tensors in a trace).
    """
    named = (("query", query), ("key", key), ("value", value))
    for name, t in named:
        reason = _operand_problem(name, t, _LAYOUT, not raises, raises)
        if reason is not None:
            return reason
    reason = _shared_problem(named, raises)  # type: ignore[arg-type]
    if reason is not None:
        return reason
    if not isinstance(dropout_p, (int, float)) or dropout_p != 0.0:
        return _problem(
            "dropout",
            ValueError,
            lambda: f"dropout_p must be 0 (MX attention is inference-only), got {dropout_p!r}",
            raises,
        )
    reason = _scale_problem(scale, raises)
    if reason is not None:
        return reason
    assert (
        isinstance(query, torch.Tensor) and isinstance(key, torch.Tensor) and isinstance(value, torch.Tensor)
    )
    b, hq, lq, d = query.shape
    bk, hk, lk, dk = key.shape
    bv, hv, lv, _ = value.shape
    if not (b == bk == bv):
        return _problem(
            "shape", ValueError, lambda: f"batch sizes differ: query {b}, key {bk}, value {bv}", raises
        )
    if dk != d:
        return _problem(
            "shape", ValueError, lambda: f"key head_dim {dk} must equal query head_dim {d}", raises
        )
    if hk != hv:
        return _problem(
            "shape",
            ValueError,
            lambda: f"key and value must have the same number of heads, got {hk} and {hv}",
            raises,
        )
    if lk != lv:
        return _problem(
            "shape",
            ValueError,
            lambda: f"key and value must have the same seq_len, got {lk} and {lv}",
            raises,
        )
    if hq != hk:
        if hk == 0:
            return _problem("shape", ValueError, lambda: f"key/value have 0 heads but query has {hq}", raises)
        if not enable_gqa:
            return _problem(
                "shape",
                ValueError,
                lambda: (
                    f"query has {hq} heads and key/value {hk}: pass enable_gqa=True for grouped-query "
                    "attention"
                ),
                raises,
            )
        if hq % hk:
            return _problem(
                "shape",
                ValueError,
                lambda: f"query heads ({hq}) must be a multiple of key/value heads ({hk}) for GQA",
                raises,
            )
    if attn_mask is None:
        return None
    return _mask_problem(attn_mask, is_causal, query, (b, hq, lq, lk), raises)


def _mask_problem(
    attn_mask: object, is_causal: object, query: torch.Tensor, target: tuple[int, ...], raises: bool
) -> str | None:
    if not isinstance(attn_mask, torch.Tensor) or (not raises and type(attn_mask) not in _PLAIN):
        return _problem(
            "mask",
            TypeError,
            lambda: (
                f"attn_mask must be a torch.Tensor (not a subclass) or None, got {type(attn_mask).__name__}"
            ),
            raises,
        )
    if is_causal:
        return _problem(
            "mask",
            ValueError,
            lambda: "pass either attn_mask or is_causal=True, not both (as torch SDPA)",
            raises,
        )
    if attn_mask.dtype != torch.bool and attn_mask.dtype not in _FLOATS:
        return _problem(
            "mask",
            TypeError,
            lambda: f"attn_mask must be bool (True = attend) or a float additive mask, got {attn_mask.dtype}",
            raises,
        )
    if attn_mask.device != query.device:
        return _problem(
            "mask",
            ValueError,
            lambda: f"attn_mask is on {attn_mask.device} but query is on {query.device}",
            raises,
        )
    if attn_mask.dim() > 4:
        return _problem(
            "mask",
            ValueError,
            lambda: (
                f"attn_mask must have at most 4 dims broadcastable to {target}, got {tuple(attn_mask.shape)}"
            ),
            raises,
        )
    try:
        fits = torch.broadcast_shapes(attn_mask.shape, target) == target
    except RuntimeError:
        fits = False
    if not fits:
        return _problem(
            "mask",
            ValueError,
            lambda: (
                f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to [B, H, Lq, Lk] = "
                f"{list(target)}"
            ),
            raises,
        )
    return None


def check_sdpa(
    query: object,
    key: object,
    value: object,
    attn_mask: object = None,
    dropout_p: object = 0.0,
    is_causal: object = False,
    scale: object = None,
    enable_gqa: object = False,
) -> float:
    """`sdpa_problem` raising its error; returns the scale to use: `scale`, or torch's 1/sqrt(D)
    (with head_dim 0 every score is 0 under any scale: 1.0)."""
    sdpa_problem(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa, raises=True)
    if scale is not None:
        return float(scale)  # type: ignore[arg-type]
    d = query.shape[-1]  # type: ignore[attr-defined]
    return 1.0 / math.sqrt(d) if d else 1.0
