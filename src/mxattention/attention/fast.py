"""The fast mode (`AttentionConfig.mma == "fp8"`) in PyTorch: the operands as FP8 tensor cores see them.

Exposes `fold_operands` (Q^, K^, V^ -> their folded values), `fold_p_values` (the exponential
tile), `ANCHORS` (which values share an anchor) and `fold_report` (how much of a call lies
outside the exact fold). `attention.operands` applies them when a config asks for the fast mode,
so `reference_attention` is the fast mode's specification on every device, with the loop of
docs/design.md, 'Attention algorithm', unchanged (its P^ V^ product is a fresh fp32 product added
to `alpha O~`, as the FP8 kernel accumulates each key tile in a fresh accumulator).

Anchors (docs/fast_mode.md): Q^ per query row (it factors into the row's score scale), K^ per head
(a constant; a per-key anchor would cost a multiply per score), V^ per output column (applied once
to O); P~ the fixed factor 2**`formats.fold.P_FOLD_EXP`. The folded values are returned in the
caller's units (f * 2**a, exact wherever the fold is), so the scores, the P~ decisions, l and O
are those of the exact method wherever every block folds exactly; elsewhere the folded operands
are the E4M3 roundings `formats.fold` defines.
"""

from __future__ import annotations

import torch

from mxattention.formats.fold import P_FOLD_EXP, fold, fold_outside, fold_p, unfold

# The axes of a [B, H, L, D] operand whose values share one anchor.
ANCHORS: dict[str, tuple[int, ...]] = {"q": (-1,), "k": (-2, -1), "v": (-2,)}
# The axis of the MX blocks of each operand (32 along the head dim for Q^ / K^, along the keys for V^).
BLOCK_AXES: dict[str, int] = {"q": -1, "k": -1, "v": -2}


def fold_operands(
    q_hat: torch.Tensor, k_hat: torch.Tensor, v_hat: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The float32 values Q^ [B, H, Lq, D], K^ [B, H, Lk, D], V^ [B, H, Lk, Dv] (MX values) take folded
    into E4M3 with the anchors of `ANCHORS`, back in the caller's units."""
    return tuple(unfold(*fold(x, ANCHORS[n])) for n, x in zip("qkv", (q_hat, k_hat, v_hat), strict=True))


def fold_p_values(p_hat: torch.Tensor) -> torch.Tensor:
    """Q(P~) (float32, values in [0, 1]) as the FP8 P~V product consumes it, in P~'s units: the
    E4M3 value of P^ 2**8, times 2**-8 (exact). PNQ's l adds these values."""
    return fold_p(p_hat) * 2.0**-P_FOLD_EXP


def fold_report(q_hat: torch.Tensor, k_hat: torch.Tensor, v_hat: torch.Tensor) -> dict[str, dict[str, int]]:
    """How many elements, MX blocks and anchor groups (rows of Q^, heads of K^, columns of V^) of each
    operand fall outside the exact fold, with the totals: {"q": {"elements": n, "elements_total": N,
    "blocks": ..., "groups": ...}, "k": ..., "v": ...}; plus "k_per_key": the K^ blocks that a
    per-key anchor would still leave outside (the share a per-key anchor would save)."""
    out: dict[str, dict[str, int]] = {}
    for name, x in zip("qkv", (q_hat, k_hat, v_hat), strict=True):
        f, a = fold(x, ANCHORS[name])
        bad = fold_outside(x, f, a, BLOCK_AXES[name])
        out[name] = {k: int(v.sum()) for k, v in bad.items()} | {
            f"{k}_total": v.numel() for k, v in bad.items()
        }
    f, a = fold(k_hat, (-1,))
    bad = fold_outside(k_hat, f, a, -1)
    out["k_per_key"] = {k: int(v.sum()) for k, v in bad.items()} | {
        f"{k}_total": v.numel() for k, v in bad.items()
    }
    return out
