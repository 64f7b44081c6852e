"""Merging partial attention results over disjoint key sets (ring / context parallelism)."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def merge_attention(
    outputs: Sequence[torch.Tensor], lses: Sequence[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine (O_i [..., L, Dv], lse_i [..., L]) computed over disjoint key chunks.

    O = sum_i w_i O_i with w_i = exp(lse_i - lse), lse = log sum_i exp(lse_i) (natural log).
    Chunks with lse = -inf (no key attended) get weight 0; rows empty in every chunk give O = 0,
    lse = -inf. Returns O in the dtype of outputs[0] and lse in fp32.
    """
    if len(outputs) != len(lses) or not outputs:
        raise ValueError(
            f"outputs and lses must be non-empty and of equal length, got {len(outputs)} and {len(lses)}"
        )
    for i, (o, s) in enumerate(zip(outputs, lses, strict=True)):
        if o.shape[:-1] != s.shape:
            raise ValueError(
                f"lses[{i}] has shape {tuple(s.shape)}, expected {tuple(o.shape[:-1])} to match outputs[{i}]"
            )
    lse = torch.stack([s.float() for s in lses])  # [n, ..., L]
    top = lse.amax(dim=0)
    top_safe = torch.where(torch.isneginf(top), torch.zeros_like(top), top)
    w = torch.exp(lse - top_safe)  # exp(-inf) = 0 for empty chunks
    total = w.sum(dim=0)
    out = sum(wi.unsqueeze(-1) * o.float() for wi, o in zip(w, outputs, strict=True))
    empty = total == 0
    out = torch.where(empty.unsqueeze(-1), 0.0, out / torch.where(empty, 1.0, total).unsqueeze(-1))
    merged_lse = torch.where(empty, -float("inf"), top_safe + torch.log(torch.where(empty, 1.0, total)))
    return out.to(outputs[0].dtype), merged_lse
