"""Diagnostics: the row-sum split adds up, the sweep finds planted optima, the ablation runs."""

from __future__ import annotations

import pytest
import torch

from mxattention.eval.diagnostics import (
    ablation,
    method_errors,
    output_error,
    q_grid,
    q_sweep,
    rowsum_study,
    sweep_histogram,
)
from tests.attention.conftest import outlier_qkv


def test_rowsum_split_adds_up_and_shows_bias():
    q, k, _ = outlier_qkv(h=2, lq=128, lk=512, seed=3, factor=2.0)
    st = rowsum_study(q * 0.3, k, chunk_rows=50)  # soft attention: high-entropy rows
    s = st.summary()
    assert s["rows"] == 2 * 128
    # The four categories partition every element's error: their sum is the mean row-sum error.
    # (up to the float32 rounding of softmax itself, whose rows sum to 1 +- ~1e-7).
    assert s["split_total"] == pytest.approx(st.mean_row_sum - 1.0, abs=1e-6)
    assert st.split["zeroing"] < 0 and st.split["round_down"] < 0 and st.split["round_up"] > 0
    assert st.split["saturation"] <= 0
    assert st.mean_row_sum < 1.0  # the consistent negative bias of direct quantization
    assert s["share_rows_entropy_gt_5"] > 0.5
    assert abs(s["global_mean_row_sum"] - 1) <= abs(st.mean_row_sum - 1)
    assert sum(b["rows"] for b in s["entropy_bins"]) == 256


def test_rowsum_tfs_has_no_saturation():
    q, k, _ = outlier_qkv(h=1, lq=64, lk=256, seed=4)
    assert rowsum_study(q, k, rule="tfs").split["saturation"] == 0.0


def test_key_mask_excludes_keys():
    q, k, _ = outlier_qkv(h=1, lq=32, lk=64, seed=5)
    mask = torch.ones(1, 1, 1, 64, dtype=torch.bool)
    mask[..., 40:] = False
    full = rowsum_study(q, k[..., :40, :], rule="uos")
    masked = rowsum_study(q, k, key_mask=mask, rule="uos")
    torch.testing.assert_close(full.row_sums, masked.row_sums)


def test_q_sweep_grid_and_optimum():
    grid = q_grid()
    assert len(grid) == 41 and grid[0] == 6.0 and grid[-1] == 8.0 and 7.25 in grid
    # Log-uniform block maxima with uniform contents: the population the UOS theory assumes.
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4000, 32, generator=g) * torch.exp2(torch.rand(4000, 1, generator=g) * 20 - 10)
    res = q_sweep(x)
    assert 7.0 <= res.best_q <= 7.5
    assert res.mse_uos < res.mse_ocp
    assert res.uos_gap < 0.02


def test_sweep_histogram_bins():
    h = sweep_histogram([7.25, 7.25, 7.2, 6.5, 7.9])
    assert h == {"<=7.15": 20.0, "7.20": 20.0, "7.25": 40.0, ">=7.30": 20.0}


def test_method_errors_and_ablation():
    q, k, v = outlier_qkv(h=1, lq=64, lk=128, seed=6)
    rows = method_errors(q, k, v, ["fp", "mxattention"])
    assert rows[0].rel_l2 == 0.0 and rows[0].cosine == pytest.approx(1.0)
    assert rows[1].rel_l2 > 0
    abl = ablation(q, k, v)
    assert [r.method for r in abl] == [
        "mxattention",
        "mxfp4-ocp-hadamard-pnq",
        "mxfp4-ocp-hadamard",
        "mxfp4-ocp",
    ]
    rel, cos, mx = output_error(torch.ones(3), torch.ones(3) * 2)
    assert rel == pytest.approx(0.5) and cos == pytest.approx(1.0) and mx == 1.0
