"""Zero-size dims at the public entry behave as torch's SDPA: an empty result of the right shape,
zeros for rows with no key (lse = -inf), and with head_dim 0 every score 0 (O = the mean of V^)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import mxattention as mx
from mxattention.formats.mx import fake_quantize

CASES = [
    ((0, 2, 8, 32), (0, 2, 8, 32), (0, 2, 8, 32)),
    ((1, 0, 8, 32), (1, 0, 8, 32), (1, 0, 8, 32)),
    ((1, 2, 0, 32), (1, 2, 8, 32), (1, 2, 8, 32)),
    ((1, 2, 8, 32), (1, 2, 0, 32), (1, 2, 0, 32)),
    ((1, 2, 8, 32), (1, 2, 8, 32), (1, 2, 8, 0)),
    ((1, 2, 8, 0), (1, 2, 8, 0), (1, 2, 8, 0)),
]


def torch_sdpa(q, k, v, **kwargs):
    """torch's SDPA, except with zero heads, where torch 2.11's CPU kernel dies of SIGFPE (seen on the
    H200 machine's torch 2.11; 2.13 returns the empty result, which is built here instead)."""
    if q.shape[1] == 0:
        return q.new_empty((*q.shape[:-1], v.shape[-1]))
    return F.scaled_dot_product_attention(q, k, v, **kwargs)


@pytest.mark.parametrize("kernels", ["0", "1"])
@pytest.mark.parametrize("qs,ks,vs", CASES)
@pytest.mark.parametrize("method", ["mxattention", "nvfp4-sage"])
def test_empty_dims_as_torch(qs, ks, vs, method, kernels, monkeypatch):
    monkeypatch.setenv("MXATTENTION_CPU_KERNELS", kernels)  # empties never reach the kernels
    q, k, v = torch.randn(qs), torch.randn(ks), torch.randn(vs)
    ref = torch_sdpa(q, k, v)
    out, lse = mx.scaled_dot_product_attention(q, k, v, method=method, return_lse=True)
    assert out.shape == ref.shape and out.dtype == ref.dtype and lse.shape == ref.shape[:-1]
    assert torch.equal(out, ref)  # empty, or zeros where there is no key
    if ks[2] == 0:
        assert torch.isneginf(lse).all()


def test_empty_causal_mask_and_gqa():
    q, k, v = torch.randn(1, 4, 8, 32), torch.randn(1, 2, 0, 32), torch.randn(1, 2, 0, 32)
    assert torch.equal(
        mx.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), torch.zeros(1, 4, 8, 32)
    )
    mask = torch.ones(1, 1, 8, 0, dtype=torch.bool)
    assert mx.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).shape == (1, 4, 8, 32)
    q0 = torch.randn(1, 0, 8, 32)
    assert mx.scaled_dot_product_attention(q0, k, v, enable_gqa=True).shape == (1, 0, 8, 32)
    with pytest.raises(ValueError, match="0 heads"):
        mx.scaled_dot_product_attention(
            q, torch.randn(1, 0, 8, 32), torch.randn(1, 0, 8, 32), enable_gqa=True
        )


def test_zero_head_dim_gives_uniform_weights():
    """No head dim: every score is 0, as torch; the weights are uniform and O is the mean of V^."""
    q, k, v = torch.randn(1, 2, 5, 0), torch.randn(1, 2, 7, 0), torch.randn(1, 2, 7, 4)
    torch.testing.assert_close(
        F.scaled_dot_product_attention(q, k, v), v.mean(-2, keepdim=True).expand(1, 2, 5, 4)
    )
    out, lse = mx.scaled_dot_product_attention(q, k, v, method="mxattention", return_lse=True)
    expect = fake_quantize(v, -2, rule="uos").mean(-2, keepdim=True).expand(1, 2, 5, 4)
    torch.testing.assert_close(out, expect)
    torch.testing.assert_close(lse, torch.full((1, 2, 5), torch.log(torch.tensor(7.0)).item()))
