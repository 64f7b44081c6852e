"""PNQ makes every row of the induced attention weights sum to one; the direct placement does not."""

from __future__ import annotations

import pytest
import torch

import mxattention as mx
from mxattention.attention import PRESETS
from mxattention.formats import fake_quantize
from mxattention.rotation import rotate
from tests.attention.conftest import outlier_qkv

PNQ = [n for n, c in PRESETS.items() if c.pnq]
# PNQ presets whose operands are rotation + MX casts only (no smoothing, MX P~ without row scale):
# their lse can be recomputed from the formats and the rotation alone.
PNQ_PLAIN = [
    n
    for n in PNQ
    if not (PRESETS[n].smooth_k or PRESETS[n].smooth_q or PRESETS[n].p_row_scale != 1.0)
    and all(s is not None and s.is_mx for s in (PRESETS[n].q, PRESETS[n].k, PRESETS[n].v, PRESETS[n].p))
]


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
    """Merging two key halves by their lse: for fp the whole; for PNQ the merged rows still sum to
    one (the lse values themselves: `test_pnq_lse_is_log_of_the_quantized_row_sums`)."""
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


def _independent_pnq_lse(q, k, method, scale):
    """lse = m + log l from scratch: S of the rotated, MX-cast Q and K (one full matrix: a test
    diagnostic), then per key tile the running max m_j, P~_j = exp(S_j - m_j), its MX cast along
    the keys, and l = sum_j exp(m_j - m) rowsum(Q(P~_j)) in float64."""
    cfg = PRESETS[method]
    s = _independent_scores(q, k, method, scale)
    m = torch.full(s.shape[:-1], -float("inf"))
    maxima, sums = [], []
    for k0 in range(0, s.shape[-1], cfg.block_n):
        s_j = s[..., k0 : k0 + cfg.block_n]
        m = torch.maximum(m, s_j.amax(-1))
        p_hat = fake_quantize(torch.exp(s_j - m[..., None]), -1, rule=cfg.p.rule, elem=cfg.p.elem)
        maxima.append(m.double())
        sums.append(p_hat.double().sum(-1))
    l = sum(torch.exp(m_j - maxima[-1]) * r_j for m_j, r_j in zip(maxima, sums, strict=True))
    return maxima[-1] + torch.log(l)


@pytest.mark.parametrize("method", PNQ_PLAIN)
def test_pnq_lse_is_log_of_the_quantized_row_sums(method):
    """The lse the entry returns is m + log(sum of the quantized tiles that multiplied V), not that
    of the unquantized weights: recomputed independently, several key tiles (running maxima)."""
    q, k, v = outlier_qkv(lq=64, lk=320, seed=3)
    scale = q.shape[-1] ** -0.5
    _, lse = mx.scaled_dot_product_attention(q, k, v, method=method, return_lse=True)
    expect = _independent_pnq_lse(q, k, method, scale)
    diff = (lse.double() - expect).abs()
    # The two S differ only in fp32 matmul blocking (ulps), which could flip a rare P~ rounding
    # decision (none here); a flip moves l >= 1 by at most one step (< 0.25). Otherwise the two
    # agree to the fp32 rounding of lse (measured <= 1.5e-5 at |lse| ~ 30-100).
    assert (diff <= 1e-6 + 2.0**-20 * expect.abs()).float().mean() >= 0.98, diff.max()
    assert diff.max() <= 0.25
    fp_lse = torch.logsumexp(_independent_scores(q, k, method, scale), -1)
    assert (lse - fp_lse).abs().max() > 1e-3  # the quantized row sums are not the fp ones


def _independent_scores(q, k, method, scale):
    cfg = PRESETS[method]
    if cfg.hadamard:
        q, k = rotate(q), rotate(k)
    qh = fake_quantize(q, -1, rule=cfg.q.rule, elem=cfg.q.elem)
    kh = fake_quantize(k, -1, rule=cfg.k.rule, elem=cfg.k.elem)
    return (qh @ kh.transpose(-1, -2)) * scale
