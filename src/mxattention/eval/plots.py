"""Figures of the reports (matplotlib, Agg canvas via `Figure`, no pyplot state).

- `plot_heightmaps`: generated heightmaps per method side by side with |method - fp| maps (rows labelled
  by seed, a colour bar per row: heights on one range over all panels, differences on a symmetric-log
  scale; the maximum difference in each panel's title).
- `plot_layer_errors`: attention-output rel-L2 per layer, one line per method (log axis, plain labels).
- `plot_rowsums`: the paper's Figure 7 (C, D): row sums of directly quantized P against row
  entropy, and the row-sum histogram of direct quantization against the global-scaling baseline.
- `plot_method_bars`: one number per method (e.g. PSNR) as bars, the value on each bar, optionally a
  marker per sample (e.g. per seed) over each bar.
- `plot_figure2`: the paper's Figure 2, the UOS objective J(q) for several phase densities.
matplotlib is imported inside each function so the core package does not need it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mxattention.formats.ladders import get_ladder
from mxattention.theory import J as objective_J
from mxattention.theory import PhaseDensity, brute_force_boundary, figure_densities, optimal_boundary


def _figure(w: float, h: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h), layout="constrained")


def plot_heightmaps(
    maps: Mapping[str, torch.Tensor],
    path: Path,
    *,
    max_seeds: int = 2,
    ref: str = "fp",
    seeds: Sequence[int] = (),
) -> Any:
    """maps: method -> [N, 1, H, W] heightmaps (metres), paired by seed. Two rows per seed, labelled:
    the maps (one colour scale per seed spanning every method's map, so nothing clips) and |map - ref|
    (one symmetric-log scale over methods, linear below 1/1000 of the row's largest difference, so
    small differences keep their structure; each panel's maximum in its title). `seeds` names the rows
    (default: the map index). Returns the matplotlib Figure."""
    from matplotlib.colors import SymLogNorm

    methods = list(maps)
    n = min(max_seeds, next(iter(maps.values())).shape[0])
    fig = _figure(2.0 * len(methods) + 0.6, 4.1 * n)
    axes = fig.subplots(2 * n, len(methods), squeeze=False)
    for s in range(n):
        seed = seeds[s] if s < len(seeds) else s
        base = maps[ref][s, 0].numpy()
        vmin = min(float(maps[m][s, 0].min()) for m in methods)
        vmax = max(float(maps[m][s, 0].max()) for m in methods)
        dmax = max(float((maps[m][s, 0] - maps[ref][s, 0]).abs().max()) for m in methods) or 1.0
        norm = SymLogNorm(linthresh=dmax * 1e-3, linscale=0.5, vmin=0.0, vmax=dmax)
        for j, m in enumerate(methods):
            img = maps[m][s, 0].numpy()
            ax = axes[2 * s, j]
            im = ax.imshow(img, cmap="terrain", vmin=vmin, vmax=vmax)
            ax.set_title(m, fontsize=8)
            ax.set_xticks([])
            ax.set_yticks([])
            ax2 = axes[2 * s + 1, j]
            diff = abs(img - base)
            im2 = ax2.imshow(diff, cmap="magma", norm=norm)
            ax2.set_title("reference" if m == ref else f"max {diff.max():.3g} m", fontsize=7)
            ax2.set_xticks([])
            ax2.set_yticks([])
        axes[2 * s, 0].set_ylabel(f"seed {seed}\nheight", fontsize=8)
        axes[2 * s + 1, 0].set_ylabel(f"seed {seed}\n|map - {ref}|", fontsize=8)
        fig.colorbar(im, ax=axes[2 * s, :].tolist(), shrink=0.8, label="height (m)")
        bar = fig.colorbar(im2, ax=axes[2 * s + 1, :].tolist(), shrink=0.8, label="|difference| (m)")
        decades = range(math.ceil(math.log10(dmax * 1e-3)), math.floor(math.log10(dmax)) + 1)
        bar.set_ticks([10.0**k for k in decades])
    fig.savefig(path, dpi=100)  # a few hundred kB: the report's figures stay well under 1 MB
    return fig


def _log_axis(ax: Any, values: Sequence[float]) -> None:
    """A log y axis with plain-number labels ("0.2", not "2 x 10^-1") and enough of them: spans under
    a decade get ticks at 1, 1.5, 2, 3, 5 and 7 times powers of ten, wider ones at 1, 2 and 5."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    pos = [v for v in values if v > 0 and math.isfinite(v)]
    wide = bool(pos) and math.log10(max(pos) / min(pos)) > 1.0
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(
        LogLocator(base=10, subs=(1.0, 2.0, 5.0) if wide else (1.0, 1.5, 2.0, 3.0, 5.0, 7.0))
    )
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def plot_layer_errors(errors: Mapping[str, Sequence[float]], path: Path, *, title: str) -> Any:
    """Attention-output rel-L2 per layer (call order), one line per method but fp, log y axis;
    returns the matplotlib Figure."""
    fig = _figure(8.0, 3.6)
    ax = fig.subplots()
    for m, errs in errors.items():
        if m == "fp":
            continue
        ax.plot(range(len(errs)), errs, marker="o", markersize=3, label=m)
    ax.set(xlabel="attention layer (call order)", ylabel="output rel-L2 vs fp", title=title)
    _log_axis(ax, [e for m, errs in errors.items() if m != "fp" for e in errs])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.savefig(path, dpi=130)
    return fig


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


def plot_method_bars(
    values: Mapping[str, float],
    path: Path,
    *,
    ylabel: str,
    title: str,
    fmt: str = "{:.2f}",
    points: Mapping[str, Sequence[float]] | None = None,
    point_labels: Sequence[str] = (),
) -> Any:
    """One bar per method, its value written on the bar; `points` (method -> one value per sample, e.g.
    per seed, named by `point_labels` in the legend) adds a marker per sample over each bar, so the
    spread behind the bar shows, and moves the bar's value into its name. Non-finite points are left
    out. Returns the matplotlib Figure."""
    fig = _figure(8.0, 3.6)
    ax = fig.subplots()
    names = list(values)
    bars = ax.bar(range(len(names)), [values[n] for n in names], color="tab:blue", alpha=0.55)
    shown = [fmt.format(values[n]) for n in names]
    if not points:
        ax.bar_label(bars, labels=shown, fontsize=7, padding=2)
    if points:
        n_points = max(len(v) for v in points.values())
        markers = "o^sDv<>p"
        for i in range(n_points):
            xs = [
                j + (i - (n_points - 1) / 2) * 0.12 for j, n in enumerate(names) if i < len(points.get(n, ()))
            ]
            ys = [points[n][i] for n in names if i < len(points.get(n, ()))]
            keep = [(x, y) for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]
            label = point_labels[i] if i < len(point_labels) else f"sample {i}"
            ax.plot(
                [x for x, _ in keep],
                [y for _, y in keep],
                linestyle="none",
                marker=markers[i % len(markers)],
                markersize=5,
                color="black",
                markerfacecolor="white" if i % 2 else "black",
                label=label,
            )
        ax.legend(fontsize=7, loc="upper left")
    # With markers over the bars the value goes into the bar's name, where no marker can cover it.
    ticks = [f"{n} ({v})" for n, v in zip(names, shown, strict=True)] if points else names
    ax.set_xticks(range(len(names)), ticks, rotation=30, ha="right", fontsize=8)
    ax.set(ylabel=ylabel, title=title)
    ax.margins(y=0.12)
    ax.grid(axis="y", alpha=0.3)
    fig.savefig(path, dpi=130)
    return fig


def theory_q_grid(elem: str, steps: int) -> np.ndarray:
    """Boundaries from the ladder's max (TFS) to 2^(emax+1) (OCP's range end): 6..8 for e2m1."""
    lad = get_ladder(elem)
    return np.linspace(lad.max_value, 2.0 ** (lad.emax + 1), steps + 1)


def plot_figure2(path: Path, elem: str = "e2m1", densities: dict[str, PhaseDensity] | None = None) -> None:
    """Save Figure 2: J(q) / min J - 1 per density over q in [max, 2^(emax+1)], q* marked.

    Needs matplotlib (imported here so the rest of the package does not).
    """
    from matplotlib.figure import Figure  # Figure + savefig uses the Agg canvas, no pyplot state

    dens = figure_densities() if densities is None else densities
    qs = theory_q_grid(elem, 400)
    q_star = optimal_boundary(elem)
    t = np.linspace(0.0, 1.0, 401)
    fig = Figure(figsize=(10.0, 4.0), layout="constrained")
    ax_h, ax_j = fig.subplots(1, 2, width_ratios=(1.0, 1.6))
    for name, d in dens.items():
        (line,) = ax_h.plot(t, d.H(t), label=name)
        vals = np.asarray(objective_J(qs, elem, d))
        q_min = brute_force_boundary(elem, d, qs)
        rel = 100.0 * (vals / vals.min() - 1.0)
        ax_j.plot(qs, rel, color=line.get_color(), label=f"{name} (grid min {q_min:g})")
        ax_j.plot(
            [q_min],
            [100.0 * (float(objective_J(q_min, elem, d)) / vals.min() - 1.0)],
            "o",
            color=line.get_color(),
        )
    ax_h.axvline(np.log2(q_star) % 1.0, color="black", linestyle=":", linewidth=1.0, label="phase of q*")
    ax_h.set(xlabel="phase t = log2(M) mod 1", ylabel="H(t)", title="phase densities")
    ax_h.legend(fontsize="small")
    ax_j.axvline(q_star, color="black", linestyle="--", linewidth=1.0, label=f"q* = {q_star:g}")
    ax_j.set(
        xlabel="boundary q (normalized block max in (q/2, q])",
        ylabel="J(q) / min J - 1  (%)",
        title=f"UOS objective, {get_ladder(elem).name}: same minimum for every density",
    )
    ax_j.legend(fontsize="small")
    fig.savefig(path, dpi=150)
