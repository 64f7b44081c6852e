"""What an attention call sees, and a recorder that keeps it.

Public: ``AttnFn``, ``LayerQKV``, ``QKVRecorder``, ``torch_sdpa``.
Everything is in torch SDPA's layout: q, k, v and the output are [B, H, L, D].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

AttnFn = Callable[..., torch.Tensor]
"""Any callable with the signature of ``torch.nn.functional.scaled_dot_product_attention``."""


def torch_sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """Torch's own SDPA in full precision, the reference every other ``AttnFn`` is compared against."""
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=attn_mask,
        dropout_p=dropout_p,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=enable_gqa,
    )


@dataclass
class LayerQKV:
    """One attention call of a model.

    ``q``, ``k``, ``v``: [B, H, L, D] fp32, exactly as handed to the attention function.
    ``attn_mask``: None, or a bool mask broadcastable to [B, H, Lq, Lk], True = may attend.
    ``scale``: the softmax scale passed with the call (None means SDPA's default 1/sqrt(D)).
    ``is_causal``: the causal flag passed with the call.
    ``out``: the attention output [B, H, Lq, D] the model used, when recorded.
    """

    name: str
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    attn_mask: torch.Tensor | None = None
    scale: float | None = None
    is_causal: bool = False
    out: torch.Tensor | None = None

    @property
    def tokens(self) -> int:
        """Number of query tokens L."""
        return self.q.shape[-2]


class QKVRecorder:
    """An ``AttnFn`` that forwards to ``inner`` and records each call as a ``LayerQKV``.

    Calls are named ``layer{i}`` in call order; a model whose layers run in a fixed order (both models
    here) therefore gets stable names. Tensors are detached copies, so recording never changes the run.
    """

    def __init__(self, inner: AttnFn | None = None, *, keep_output: bool = True) -> None:
        self.inner: AttnFn = torch_sdpa if inner is None else inner
        self.keep_output = keep_output
        self.records: list[LayerQKV] = []

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        attn_mask: torch.Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> torch.Tensor:
        out = self.inner(
            q,
            k,
            v,
            attn_mask=attn_mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=enable_gqa,
        )
        self.records.append(
            LayerQKV(
                name=f"layer{len(self.records)}",
                q=q.detach().float().clone(),
                k=k.detach().float().clone(),
                v=v.detach().float().clone(),
                attn_mask=None if attn_mask is None else attn_mask.detach().clone(),
                scale=scale,
                is_causal=is_causal,
                out=out.detach().float().clone() if self.keep_output else None,
            )
        )
        return out
