"""Packed variable-length batches (flash-attn's varlen layout) on the PyTorch reference.

Exposes `VarlenShapes`, `spans`, `per_sequence`, `check_varlen` (the checks that need no data: types, shapes, dtypes,
devices), `seq_bounds` (the checks of the prefix sums' values, on the host) and `varlen_reference`.

Layout: q [total_q, H, D], k [total_k, Hkv, D], v [total_k, Hkv, Dv]; `cu_seqlens_q` /
`cu_seqlens_k` int32 [n + 1], prefix sums from 0; sequence i is rows cu[i]:cu[i+1] of each. Every
sequence is attended on its own, as a dense call of its rows would be (docs/design.md, 'Varlen'):
its MX blocks along the keys (V, P~) and its tiles start at its own first token, so the result
equals per-sequence dense calls bit for bit. A sequence with queries and no keys gives O = 0 and
lse = -inf, as a dense row with every key masked.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import torch

from mxattention.attention.config import AttentionConfig
from mxattention.attention.inputs import check_operands
from mxattention.attention.reference import cast_output, reference_attention


@dataclass(frozen=True)
class VarlenShapes:
    total_q: int
    total_k: int
    q_heads: int
    kv_heads: int
    head_dim: int
    v_dim: int
    num_seqs: int


def _check_max(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise TypeError(f"{name} must be a non-negative int or None, got {value!r}")


def check_varlen(
    q: object,
    k: object,
    v: object,
    cu_seqlens_q: object,
    cu_seqlens_k: object,
    max_seqlen_q: object = None,
    max_seqlen_k: object = None,
) -> VarlenShapes:
    """Check everything about a varlen call that does not need the prefix sums' values."""
    q, k, v = check_operands((("q", q), ("k", k), ("v", v)), ("total_tokens", "heads", "head_dim"))
    tq, hq, d = q.shape
    tk, hk, dk = k.shape
    tv, hv, dv = v.shape
    if dk != d:
        raise ValueError(f"k head_dim {dk} must equal q head_dim {d}")
    if hk != hv:
        raise ValueError(f"k and v must have the same number of heads, got {hk} and {hv}")
    if tk != tv:
        raise ValueError(f"k and v must have the same total_tokens, got {tk} and {tv}")
    # Zero heads or head dims are served as the dense entry serves them (`attention.inputs.Shapes.empty`):
    # an empty O, or with D = 0 every score 0.
    if hk == 0 and hq:
        raise ValueError(f"k/v have 0 heads but q has {hq}")
    if hk and hq % hk:
        raise ValueError(f"q heads ({hq}) must be a multiple of k/v heads ({hk}) for grouped-query attention")
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{name} must be int32 (flash-attn's layout), got {cu.dtype}")
        if cu.dim() != 1 or cu.numel() < 2:
            raise ValueError(
                f"{name} must be 1-D [num_seqs + 1] with num_seqs >= 1, got shape {tuple(cu.shape)}"
            )
        if cu.device != q.device:
            raise ValueError(f"{name} is on {cu.device} but q is on {q.device}")
    assert isinstance(cu_seqlens_q, torch.Tensor) and isinstance(cu_seqlens_k, torch.Tensor)
    if cu_seqlens_q.numel() != cu_seqlens_k.numel():
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must describe the same number of sequences, got "
            f"{cu_seqlens_q.numel() - 1} and {cu_seqlens_k.numel() - 1}"
        )
    _check_max("max_seqlen_q", max_seqlen_q)
    _check_max("max_seqlen_k", max_seqlen_k)
    return VarlenShapes(tq, tk, hq, hk, d, dv, cu_seqlens_q.numel() - 1)


def _check_prefix_sums(name: str, cu: list[int], total: int, tensor: str) -> int:
    """The longest sequence of prefix sums `cu`, after checking them against `total` rows."""
    if cu[0] != 0:
        raise ValueError(f"{name} must start at 0, got {cu[0]}")
    lens = [b - a for a, b in pairwise(cu)]
    if min(lens) < 0:
        i = next(i for i, n in enumerate(lens) if n < 0)
        raise ValueError(f"{name} must be non-decreasing, but {name}[{i + 1}] = {cu[i + 1]} < {cu[i]}")
    if cu[-1] != total:
        raise ValueError(f"{name}[-1] = {cu[-1]} must equal {tensor}.shape[0] = {total}")
    return max(lens)


def seq_bounds(
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    shapes: VarlenShapes,
    max_seqlen_q: int | None = None,
    max_seqlen_k: int | None = None,
) -> tuple[list[int], list[int], int, int]:
    """(cu_q, cu_k as lists, max_seqlen_q, max_seqlen_k), the prefix sums checked.

    Reads both tensors on the host: one device-to-host copy (a sync on CUDA) per call. A given
    max_seqlen must be at least the longest sequence (larger is allowed: it only sizes grids);
    None is replaced by the longest sequence.
    """
    both = torch.stack([cu_seqlens_q, cu_seqlens_k]).tolist()
    cu_q, cu_k = both
    longest_q = _check_prefix_sums("cu_seqlens_q", cu_q, shapes.total_q, "q")
    longest_k = _check_prefix_sums("cu_seqlens_k", cu_k, shapes.total_k, "k")
    for name, given, longest in (
        ("max_seqlen_q", max_seqlen_q, longest_q),
        ("max_seqlen_k", max_seqlen_k, longest_k),
    ):
        if given is not None and given < longest:
            raise ValueError(f"{name} = {given} is less than the longest sequence, {longest}")
    mq = longest_q if max_seqlen_q is None else max_seqlen_q
    mk = longest_k if max_seqlen_k is None else max_seqlen_k
    return cu_q, cu_k, mq, mk


def spans(cu_q: list[int], cu_k: list[int]) -> list[tuple[int, int, int, int]]:
    """(q0, q1, k0, k1) of each sequence: its query rows q0:q1 and key rows k0:k1."""
    return [(*a, *b) for a, b in zip(pairwise(cu_q), pairwise(cu_k), strict=True)]


def varlen_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_q: list[int],
    cu_k: list[int],
    cfg: AttentionConfig,
    *,
    is_causal: bool = False,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O [total_q, H, Dv] in q's dtype, lse [H, total_q] fp32, natural log) of a packed batch.

    `cu_q` / `cu_k`: the checked prefix sums (`seq_bounds`). Each sequence runs
    `reference_attention` on views of its rows (heads matched per sequence for GQA), so the extra
    memory is that of the longest sequence's dense call; causal is top-left per sequence, as
    torch SDPA's `is_causal` (key j attends query i iff j <= i).
    """
    group = q.shape[1] // max(1, k.shape[1])  # (no heads: nothing to group)

    def attend(qi, ki, vi):
        qi, ki, vi = qi.float(), ki.float(), vi.float()
        if group > 1:
            ki, vi = ki.repeat_interleave(group, dim=1), vi.repeat_interleave(group, dim=1)
        o, l = reference_attention(qi, ki, vi, cfg, is_causal=is_causal, scale=scale)
        return cast_output(o, q.dtype), l

    return per_sequence(q, k, v, cu_q, cu_k, attend)


def per_sequence(q, k, v, cu_q: list[int], cu_k: list[int], attend) -> tuple[torch.Tensor, torch.Tensor]:
    """(O [total_q, H, Dv] in q's dtype, lse [H, total_q] fp32) from `attend(q_i, k_i, v_i)` on each
    sequence's rows as [1, H, L, D] views, which returns its dense (O [1, H, Lq, Dv], lse [1, H, Lq]).
    Sequences without queries are skipped; queries without keys get O = 0, lse = -inf."""
    tq, hq, _ = q.shape
    out = torch.zeros((tq, hq, v.shape[2]), dtype=q.dtype, device=q.device)
    lse = torch.full((hq, tq), -float("inf"), dtype=torch.float32, device=q.device)
    for q0, q1, k0, k1 in spans(cu_q, cu_k):
        if q1 == q0 or k1 == k0:
            continue
        o, l = attend(*(x[a:b].permute(1, 0, 2)[None] for x, a, b in ((q, q0, q1), (k, k0, k1), (v, k0, k1))))
        out[q0:q1] = o[0].permute(1, 0, 2)
        lse[:, q0:q1] = l[0]
    return out, lse
