"""The `fp` method is exactly attention: equal to torch SDPA (fp32, rel-L2 <= 1e-5) in every mode."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import mxattention as mx


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("d", [32, 64, 80, 128, 256])
def test_head_dims(d):
    q, k, v = (torch.randn(2, 3, 37, d) for _ in range(3))
    assert (
        _rel(mx.scaled_dot_product_attention(q, k, v, method="fp"), F.scaled_dot_product_attention(q, k, v))
        <= 1e-5
    )


@pytest.mark.parametrize(("lq", "lk"), [(1, 1), (33, 200), (200, 33), (129, 129), (64, 512)])
def test_lengths_and_cross_attention(lq, lk):
    q, k, v = torch.randn(1, 2, lq, 64), torch.randn(1, 2, lk, 64), torch.randn(1, 2, lk, 48)
    out = mx.scaled_dot_product_attention(q, k, v, method="fp")
    assert out.shape == (1, 2, lq, 48)
    assert _rel(out, F.scaled_dot_product_attention(q, k, v)) <= 1e-5


@pytest.mark.parametrize("lq", [50, 130])
def test_causal(lq):
    q, k, v = torch.randn(1, 2, lq, 64), torch.randn(1, 2, 130, 64), torch.randn(1, 2, 130, 64)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert _rel(mx.scaled_dot_product_attention(q, k, v, is_causal=True, method="fp"), want) <= 1e-5


def test_bool_key_mask_like_hunyuan():
    q, k, v = (torch.randn(2, 4, 70, 64) for _ in range(3))
    mask = torch.ones(2, 1, 1, 70, dtype=torch.bool)
    mask[0, ..., 50:] = False
    mask[1, ..., :3] = False
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert _rel(mx.scaled_dot_product_attention(q, k, v, attn_mask=mask, method="fp"), want) <= 1e-5


@pytest.mark.parametrize("shape", [(70, 90), (1, 90), (4, 1, 90), (2, 4, 70, 90)])
def test_additive_and_bool_masks_broadcast(shape):
    q, k, v = torch.randn(2, 4, 70, 32), torch.randn(2, 4, 90, 32), torch.randn(2, 4, 90, 32)
    add = torch.randn(shape)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=add)
    assert _rel(mx.scaled_dot_product_attention(q, k, v, attn_mask=add, method="fp"), want) <= 1e-5
    boolean = torch.rand(shape) > 0.3
    boolean[..., 0] = True  # no fully masked rows (torch returns NaN there)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=boolean)
    assert _rel(mx.scaled_dot_product_attention(q, k, v, attn_mask=boolean, method="fp"), want) <= 1e-5


def test_gqa():
    q, k, v = torch.randn(1, 8, 40, 64), torch.randn(1, 2, 60, 64), torch.randn(1, 2, 60, 64)
    want = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    assert _rel(mx.scaled_dot_product_attention(q, k, v, enable_gqa=True, method="fp"), want) <= 1e-5


def test_scale_argument():
    q, k, v = (torch.randn(1, 2, 40, 64) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, scale=0.3)
    assert _rel(mx.scaled_dot_product_attention(q, k, v, scale=0.3, method="fp"), want) <= 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_return_input_dtype(dtype):
    q, k, v = (torch.randn(1, 2, 40, 64, dtype=dtype) for _ in range(3))
    out = mx.scaled_dot_product_attention(q, k, v, method="fp")
    assert out.dtype == dtype
    want = F.scaled_dot_product_attention(q.float(), k.float(), v.float())
    assert _rel(out, want) <= 1e-2  # only the final cast to the half dtype rounds


@pytest.mark.parametrize(("bm", "bn"), [(16, 32), (64, 64), (128, 256), (7, 96)])
def test_independent_of_tiles(bn, bm):
    q, k, v = (torch.randn(1, 2, 150, 64) for _ in range(3))
    cfg = mx.get_method("fp").with_tiles(block_m=bm, block_n=bn)
    want = F.scaled_dot_product_attention(q, k, v)
    assert _rel(mx.scaled_dot_product_attention(q, k, v, method=cfg), want) <= 1e-5


def test_fully_masked_rows_are_zero_not_nan():
    q, k, v = (torch.randn(1, 1, 10, 32) for _ in range(3))
    mask = torch.ones(1, 1, 10, 10, dtype=torch.bool)
    mask[..., 3, :] = False
    for method in ("fp", "mxattention", "mxfp4-ocp", "nvfp4-sage"):
        out, lse = mx.scaled_dot_product_attention(q, k, v, attn_mask=mask, method=method, return_lse=True)
        assert not torch.isnan(out).any()
        assert (out[..., 3, :] == 0).all() and torch.isneginf(lse[..., 3]).all()


def test_lse_matches_logsumexp():
    q, k, v = (torch.randn(1, 2, 33, 64) for _ in range(3))
    _, lse = mx.scaled_dot_product_attention(q, k, v, method="fp", return_lse=True)
    want = torch.logsumexp(q @ k.transpose(-1, -2) / 8.0, dim=-1)  # diagnostic: 33 x 33 is fine
    torch.testing.assert_close(lse, want, rtol=1e-5, atol=1e-5)
