"""Attention-output error of methods against the `fp` method, and the paper's sequential ablation."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from mxattention.attention.config import ABLATION, AttentionConfig, get_method

AttnFn = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class ErrorRow:
    method: str
    rel_l2: float
    cosine: float
    max_abs: float


def output_error(out: torch.Tensor, ref: torch.Tensor) -> tuple[float, float, float]:
    """(relative L2, cosine similarity, max abs error) of `out` against `ref`, over all elements."""
    o, r = out.double().flatten(), ref.double().flatten()
    rel = float((o - r).norm() / r.norm().clamp_min(1e-300))
    cos = float(torch.nn.functional.cosine_similarity(o, r, dim=0))
    return rel, cos, float((o - r).abs().max())


def method_errors(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    methods: Sequence[str | AttentionConfig],
    *,
    attn_fn: AttnFn | None = None,
    **sdpa_kwargs,
) -> list[ErrorRow]:
    """Error of each method's attention output against `fp` on the same Q, K, V [B, H, L, D].

    `attn_fn` defaults to `mxattention.scaled_dot_product_attention` (kernels where available).
    """
    if attn_fn is None:
        from mxattention.ops import scaled_dot_product_attention as attn_fn
    ref = attn_fn(q, k, v, method="fp", **sdpa_kwargs)
    rows = []
    for m in methods:
        cfg = get_method(m)
        rows.append(ErrorRow(cfg.name, *output_error(attn_fn(q, k, v, method=cfg, **sdpa_kwargs), ref)))
    return rows


def ablation(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> list[ErrorRow]:
    """The paper's sequential ablation (Full, w/o UOS, w/o PNQ and UOS, OCP) as one call."""
    return method_errors(q, k, v, ABLATION, **kwargs)
