"""Row-sum study of a directly quantized softmax matrix (the paper's Figure 7).

THIS DIAGNOSTIC MATERIALIZES the attention probabilities P = softmax(Q K^T * scale), one chunk of
`chunk_rows` rows at a time (so memory is chunk_rows x Lk per head), to measure how MXFP4
quantization of P along the keys (32 per block) breaks the rows' normalization.

Per row r of Q(P): the row sum, its entropy H_r = -sum p log p (nats), and the split of the row-sum
error sum_j (Q(p_j) - p_j) by what happened to each element: zeroing (p > 0 -> 0), saturation
(normalized value above the ladder max, clipped), round-down, round-up. The global pre-quant
scaling baseline multiplies all of P by one factor c before quantization and uses Q(c P) as the
weights, with c chosen on a grid to bring the mean row sum closest to one: it fixes the mean,
and the paper's point is that it over-normalizes many rows while doing so.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from mxattention.formats.ladders import E2M1
from mxattention.formats.mx import fake_quantize, mx_quantize

CATEGORIES = ("zeroing", "saturation", "round_down", "round_up")


@dataclass
class RowSumStudy:
    """Row sums and error split of Q(P) for one tensor (all heads and rows pooled)."""

    rule: str
    row_sums: torch.Tensor  # [rows] float64
    entropy: torch.Tensor  # [rows] nats
    split: dict[str, float]  # mean per-row contribution of each category to (row sum - 1)
    global_scale: float
    global_row_sums: torch.Tensor  # [rows] under the global pre-quant scaling baseline
    entropy_bins: list[dict] = field(default_factory=list)

    @property
    def mean_row_sum(self) -> float:
        return float(self.row_sums.mean())

    def over_normalized(self, tol: float = 1e-3) -> tuple[float, float]:
        """Fraction of rows with sum > 1 + tol: (direct quantization, global scaling baseline)."""
        return float((self.row_sums > 1 + tol).double().mean()), float(
            (self.global_row_sums > 1 + tol).double().mean()
        )

    def summary(self) -> dict:
        over, over_g = self.over_normalized()
        return {
            "rule": self.rule,
            "rows": int(self.row_sums.numel()),
            "mean_row_sum": self.mean_row_sum,
            "mean_entropy": float(self.entropy.mean()),
            "split": self.split,
            "split_total": sum(self.split.values()),
            "share_rows_entropy_gt_5": float((self.entropy > 5).double().mean()),
            "share_high_entropy_under_normalized": float(
                (self.row_sums[self.entropy > 5] < 1).double().mean()
                if (self.entropy > 5).any()
                else float("nan")
            ),
            "global_scale": self.global_scale,
            "global_mean_row_sum": float(self.global_row_sums.mean()),
            "over_normalized_direct": over,
            "over_normalized_global": over_g,
            "entropy_bins": self.entropy_bins,
        }


def _softmax_chunks(
    q: torch.Tensor, k: torch.Tensor, scale: float, key_mask: torch.Tensor | None, chunk_rows: int
):
    """Yield P chunks [B, H, rows, Lk] (float32). Materializes P chunk by chunk (diagnostic)."""
    kt = k.float().transpose(-1, -2)
    for r0 in range(0, q.shape[-2], chunk_rows):
        s = (q[..., r0 : r0 + chunk_rows, :].float() @ kt) * scale
        if key_mask is not None:  # a per-query mask [.., Lq, Lk] gives this chunk's rows
            rows = key_mask if key_mask.shape[-2] == 1 else key_mask[..., r0 : r0 + chunk_rows, :]
            s = s.masked_fill(~rows, -float("inf"))
        yield torch.softmax(s, dim=-1)


def _classify(p: torch.Tensor, rule: str):
    """Per-row sums of Q(p) - p by category; p [..., Lk] float32, quantized along the last axis."""
    qp = fake_quantize(p, -1, rule=rule)
    mx = mx_quantize(p, -1, rule=rule)
    scale = torch.exp2(mx.scales.double() - 127).repeat_interleave(32, dim=-1)[..., : p.shape[-1]]
    normalized = p.double() / scale
    d = qp.double() - p.double()
    zero = (qp == 0) & (p > 0)
    sat = ~zero & (normalized > E2M1.max_value)
    down = ~zero & ~sat & (d < 0)
    up = d > 0
    return qp, {n: (d * m).sum(-1) for n, m in zip(CATEGORIES, (zero, sat, down, up), strict=True)}


def rowsum_study(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    scale: float | None = None,
    key_mask: torch.Tensor | None = None,
    rule: str = "ocp",
    chunk_rows: int = 256,
    global_grid: torch.Tensor | None = None,
) -> RowSumStudy:
    """Study the rows of Q(softmax(Q K^T scale)) for Q [B, H, Lq, D], K [B, H, Lk, D].

    `key_mask`: optional bool [B, 1 or H, 1, Lk] (True = attend); masked keys get p = 0 and
    padded query rows should be dropped by the caller. Materializes P in chunks (see module doc).
    """
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    grid = torch.linspace(1.0, 1.5, 101) if global_grid is None else global_grid
    sums, ents, split = [], [], {c: [] for c in CATEGORIES}
    gsums: list[list[torch.Tensor]] = [[] for _ in grid]
    for p in _softmax_chunks(q, k, scale, key_mask, chunk_rows):
        qp, parts = _classify(p, rule)
        sums.append(qp.double().sum(-1).flatten())
        ents.append(-(p.double() * torch.log(p.double().clamp_min(1e-300))).sum(-1).flatten())
        for c in CATEGORIES:
            split[c].append(parts[c].flatten())
        for i, c in enumerate(grid.tolist()):
            gsums[i].append(fake_quantize(p * c, -1, rule=rule).double().sum(-1).flatten())
    row_sums, entropy = torch.cat(sums), torch.cat(ents)
    gmeans = [torch.cat(g).mean() for g in gsums]
    best = min(range(len(grid)), key=lambda i: abs(float(gmeans[i]) - 1.0))
    bins = []
    edges = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, float("inf")]
    for lo, hi in itertools.pairwise(edges):
        m = (entropy >= lo) & (entropy < hi)
        if m.any():
            rs = row_sums[m]
            bins.append(
                {
                    "entropy": f"[{lo:g}, {hi:g})",
                    "rows": int(m.sum()),
                    "mean_row_sum": float(rs.mean()),
                    "under": float((rs < 1 - 1e-3).double().mean()),
                    "over": float((rs > 1 + 1e-3).double().mean()),
                }
            )
    return RowSumStudy(
        rule=rule,
        row_sums=row_sums,
        entropy=entropy,
        split={c: float(torch.cat(v).mean()) for c, v in split.items()},
        global_scale=float(grid[best]),
        global_row_sums=torch.cat(gsums[best]),
        entropy_bins=bins,
    )
