"""PNQ makes every row of the induced attention weights sum to one; the direct placement does not."""

from __future__ import annotations

import pytest
import torch

import mxattention as mx
from mxattention.attention import PRESETS
from tests.attention.conftest import outlier_qkv

PNQ = [n for n, c in PRESETS.items() if c.pnq]


@pytest.mark.parametrize("method", PNQ)
@pytest.mark.parametrize("causal", [False, True])
def test_pnq_rows_sum_to_one(method, causal):
    q, k, _ = outlier_qkv(lq=200, lk=200, seed=1)
    # V = 1: O = sum_j w_j exactly when V^ = 1 (1 is on the E2M1 ladder with scale 2**-2 under
    # UOS/TFS and 2**-2 under OCP), so O is the row sum of the induced weights.
    ones = torch.ones_like(k)
    out = mx.scaled_dot_product_attention(q, k, ones, method=method, is_causal=causal)
    assert (out - 1).abs().max().item() <= 1e-6


def test_direct_placement_breaks_row_sums():
    q, k, _ = outlier_qkv(lq=200, lk=200, seed=1)
    out = mx.scaled_dot_product_attention(q, k, torch.ones_like(k), method="mxfp4-ocp")
    dev = (out - 1).abs()
    assert dev.max().item() > 1e-2  # measurably off
    assert dev.mean().item() > 1e-3


@pytest.mark.parametrize("method", [*PNQ, "fp"])
def test_lse_is_that_of_the_weights_used(method):
    """exp(S~ - lse) summed over keys, with S~ the scores the method saw, is the row sum: for PNQ
    that is checked through the output with V = 1 and the merge of two halves below."""
    q, k, v = outlier_qkv(lq=64, lk=256, seed=2)
    out, lse = mx.scaled_dot_product_attention(q, k, v, method=method, return_lse=True)
    halves = [
        mx.scaled_dot_product_attention(q, k[..., s, :], v[..., s, :], method=method, return_lse=True)
        for s in (slice(0, 128), slice(128, 256))
    ]
    merged, merged_lse = mx.merge_attention([h[0] for h in halves], [h[1] for h in halves])
    if method == "fp":
        torch.testing.assert_close(merged, out, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(merged_lse, lse, rtol=1e-5, atol=1e-5)
    else:
        ones = torch.ones_like(v[..., :128, :])
        parts = [
            mx.scaled_dot_product_attention(q, k[..., s, :], ones, method=method, return_lse=True)
            for s in (slice(0, 128), slice(128, 256))
        ]
        merged_ones, _ = mx.merge_attention([p[0] for p in parts], [p[1] for p in parts])
        assert (merged_ones - 1).abs().max().item() <= 1e-6  # merged PNQ rows still sum to one
