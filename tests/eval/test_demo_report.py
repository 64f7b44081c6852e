"""The demo report's figures and sentences say what the numbers are (issue 27): heightmaps on a range
that clips nothing, differences on a scale that shows small ones, per-seed PSNR points, readable log
axes, captions that match their tables, and a conclusion that names the most accurate 4-bit preset
from the run's own numbers. Synthetic inputs: no model runs here."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("matplotlib")

from mxattention.eval.demo import DEMO_METHODS, _token_runs
from mxattention.eval.plots import plot_heightmaps, plot_layer_errors, plot_method_bars
from mxattention.eval.study import four_bit_class, leader_sentences


def _maps() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ref = torch.rand(1, 1, 16, 16, generator=g)
    hot = ref.clone()
    hot[0, 0, 0, 0] = 5.0  # far above fp's maximum, in one corner
    return {"fp": ref, "hot": hot, "close": ref + 0.04 * torch.rand(1, 1, 16, 16, generator=g)}


def test_heightmaps_clip_nothing_and_show_small_differences(tmp_path):
    maps = _maps()
    fig = plot_heightmaps(maps, tmp_path / "h.png", seeds=[7])
    axes = fig.axes
    heights = [ax.images[0] for ax in axes[:3]]
    lo = min(float(m.min()) for m in maps.values())
    hi = max(float(m.max()) for m in maps.values())
    assert all(im.get_clim() == pytest.approx((lo, hi)) for im in heights)  # every panel, no clipping
    diff = axes[5].images[0]  # |close - fp|: at most 0.04, ~100 times below the row's largest difference
    largest = float((maps["hot"] - maps["fp"]).abs().max())
    assert diff.norm.vmax == pytest.approx(largest)
    # On a linear scale it would take 1 % of the colour range (black); here about 40 %.
    assert float(diff.norm(float((maps["close"] - maps["fp"]).abs().max()))) > 0.3


def test_psnr_bars_carry_one_marker_per_seed(tmp_path):
    per_seed = {"a": [33.7, 61.1], "b": [50.0, float("inf")]}
    fig = plot_method_bars(
        {"a": 47.4, "b": 55.0},
        tmp_path / "p.png",
        ylabel="dB",
        title="t",
        points=per_seed,
        point_labels=["seed 0", "seed 1"],
    )
    ax = fig.axes[0]
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.lines}
    assert lines == {"seed 0": [33.7, 50.0], "seed 1": [61.1]}  # the infinite PSNR is left out


def test_layer_error_axis_has_plain_labels_within_a_decade(tmp_path):
    errors = {
        "fp": [0.0] * 6,
        "a": [0.12, 0.33, 0.29, 0.28, 0.22, 0.2],
        "b": [0.1, 0.2, 0.19, 0.17, 0.14, 0.12],
    }
    fig = plot_layer_errors(errors, tmp_path / "e.png", title="t")
    fig.canvas.draw()
    ax = fig.axes[0]
    lo, hi = ax.get_ylim()
    labels = [t.get_text() for t in ax.get_yticklabels() if lo <= t.get_position()[1] <= hi and t.get_text()]
    assert len(labels) >= 3 and all(float(x) > 0 for x in labels)  # "0.15", not "$1.5 \\times 10^{-1}$"


def test_token_runs_name_each_run_of_layers():
    tokens = [1024] * 4 + [256] * 4 + [64] * 10 + [256] * 5 + [1024] * 5
    assert _token_runs(tokens) == "1024 in layers 0-3, 256 in 4-7, 64 in 8-17, 256 in 18-22, 1024 in 23-27"
    assert _token_runs([40]) == "40 in layer 0"


def _res(psnr: dict[str, float], cos: dict[str, float]) -> dict:
    return {
        "terrain": {"heightmap_quality": {k: {"psnr_db": v} for k, v in psnr.items()}},
        "minilm": {"embedding_cosine": cos},
    }


def test_leader_is_the_best_four_bit_method_of_the_run():
    assert "mxattention-pv8-smooth" in DEMO_METHODS
    assert four_bit_class("mxattention-pv8-smooth") and four_bit_class("nvfp4")
    assert not four_bit_class("mxfp8") and not four_bit_class("fp")
    psnr = {
        "fp": float("inf"),
        "mxfp8": 90.0,
        "mxattention": 48.0,
        "nvfp4-sage": 63.74,
        "mxattention-pv8-smooth": 68.64,
    }
    cos = {
        "fp": 1.0,
        "mxfp8": 0.9999,
        "mxattention": 0.98,
        "nvfp4-sage": 0.99206,
        "mxattention-pv8-smooth": 0.99788,
    }
    (both,) = leader_sentences(_res(psnr, cos))
    assert "on both models: mxattention-pv8-smooth" in both
    assert "68.64 dB against nvfp4-sage's 63.74 dB" in both and "0.99788 against nvfp4-sage's 0.99206" in both
    psnr["nvfp4-sage"] = 70.0
    (split,) = leader_sentences(_res(psnr, cos))
    assert "nvfp4-sage on terrain, mxattention-pv8-smooth on MiniLM" in split
    assert leader_sentences(_res({"fp": 1.0, "nvfp4": 2.0}, {"fp": 1.0, "nvfp4": 0.9})) == []
