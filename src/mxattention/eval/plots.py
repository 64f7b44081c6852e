"""Figures of the reports (matplotlib, Agg canvas via `Figure`, no pyplot state).

- `plot_heightmaps`: generated heightmaps per method side by side with |method - fp| maps.
- `plot_layer_errors`: attention-output rel-L2 per layer, one line per method.
- `plot_rowsums`: the paper's Figure 7 (C, D): row sums of directly quantized P against row
  entropy, and the row-sum histogram of direct quantization against the global-scaling baseline.
- `plot_method_bars`: one number per method (e.g. PSNR) as bars.
matplotlib is imported inside each function so the core package does not need it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import torch


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), layout="constrained")


def plot_heightmaps(
    maps: Mapping[str, torch.Tensor], path: Path, *, max_seeds: int = 2, ref: str = "fp"
) -> None:
    """maps: method -> [N, 1, H, W] heightmaps (metres), paired by seed. Two rows per seed:
    the maps (shared colour scale) and |map - fp| (shared scale over methods)."""
    methods = list(maps)
    n = min(max_seeds, next(iter(maps.values())).shape[0])
    fig = _figure(2.0 * len(methods), 4.1 * n)
    axes = fig.subplots(2 * n, len(methods), squeeze=False)
    for s in range(n):
        base = maps[ref][s, 0].numpy()
        vmin, vmax = float(base.min()), float(base.max())
        dmax = max(float((maps[m][s, 0] - maps[ref][s, 0]).abs().max()) for m in methods) or 1.0
        for j, m in enumerate(methods):
            img = maps[m][s, 0].numpy()
            ax = axes[2 * s, j]
            im = ax.imshow(img, cmap="terrain", vmin=vmin, vmax=vmax)
            ax.set_title(m, fontsize=8)
            ax.set_axis_off()
            ax2 = axes[2 * s + 1, j]
            im2 = ax2.imshow(abs(img - base), cmap="magma", vmin=0, vmax=dmax)
            ax2.set_title(f"|diff| max {abs(img - base).max():.2f} m", fontsize=7)
            ax2.set_axis_off()
        fig.colorbar(im, ax=axes[2 * s, :].tolist(), shrink=0.8, label="height (m)")
        fig.colorbar(im2, ax=axes[2 * s + 1, :].tolist(), shrink=0.8, label="|difference| (m)")
    fig.savefig(path, dpi=110)


def plot_layer_errors(errors: Mapping[str, Sequence[float]], path: Path, *, title: str) -> None:
    fig = _figure(8.0, 3.6)
    ax = fig.subplots()
    for m, errs in errors.items():
        if m == "fp":
            continue
        ax.plot(range(len(errs)), errs, marker="o", markersize=3, label=m)
    ax.set(xlabel="attention layer (call order)", ylabel="output rel-L2 vs fp", title=title, yscale="log")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.savefig(path, dpi=130)


def plot_rowsums(
    row_sums: torch.Tensor, entropy: torch.Tensor, global_row_sums: torch.Tensor, path: Path, *, title: str
) -> None:
    fig = _figure(10.0, 3.8)
    ax_e, ax_h = fig.subplots(1, 2)
    ax_e.scatter(entropy.numpy(), row_sums.numpy(), s=2, alpha=0.3)
    ax_e.axhline(1.0, color="black", linewidth=1)
    ax_e.set(
        xlabel="row entropy (nats)", ylabel="row sum of Q(P)", title="direct OCP MXFP4: row sum vs entropy"
    )
    lo = float(min(row_sums.min(), global_row_sums.min()))
    hi = float(max(row_sums.max(), global_row_sums.max()))
    bins = torch.linspace(lo, hi, 60).numpy()
    ax_h.hist(row_sums.numpy(), bins=bins, alpha=0.6, label=f"direct (mean {float(row_sums.mean()):.4f})")
    ax_h.hist(
        global_row_sums.numpy(),
        bins=bins,
        alpha=0.6,
        label=f"global scaling (mean {float(global_row_sums.mean()):.4f})",
    )
    ax_h.axvline(1.0, color="black", linewidth=1)
    ax_h.set(xlabel="row sum", ylabel="rows", title="fixing the mean over-normalizes rows")
    ax_h.legend(fontsize=8)
    fig.suptitle(title)
    fig.savefig(path, dpi=130)


def plot_method_bars(values: Mapping[str, float], path: Path, *, ylabel: str, title: str) -> None:
    fig = _figure(8.0, 3.4)
    ax = fig.subplots()
    names = list(values)
    ax.bar(range(len(names)), [values[n] for n in names], color="tab:blue")
    ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=8)
    ax.set(ylabel=ylabel, title=title)
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=130)
