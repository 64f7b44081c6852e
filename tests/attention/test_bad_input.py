"""Bad input to the SDPA entry point: clear TypeError / ValueError naming the argument."""

from __future__ import annotations

import pytest
import torch

import mxattention as mx


def _qkv(**shapes):
    q = torch.randn(shapes.get("q", (1, 2, 8, 32)))
    k = torch.randn(shapes.get("k", (1, 2, 8, 32)))
    v = torch.randn(shapes.get("v", (1, 2, 8, 32)))
    return q, k, v


@pytest.mark.parametrize(
    ("shapes", "match"),
    [
        ({"k": (2, 2, 8, 32)}, "batch sizes differ"),
        ({"k": (1, 2, 8, 16)}, "key head_dim 16 must equal query head_dim 32"),
        ({"k": (1, 3, 8, 32), "v": (1, 3, 8, 32)}, "enable_gqa=True"),
        ({"v": (1, 2, 9, 32)}, "same seq_len"),
        ({"v": (1, 1, 8, 32)}, "same number of heads"),
        ({"q": (2, 8, 32)}, "query must be 4-D"),
    ],
)
def test_shape_mismatch(shapes, match):
    with pytest.raises(ValueError, match=match):
        mx.scaled_dot_product_attention(*_qkv(**shapes))


def test_gqa_not_a_multiple():
    q, k, v = _qkv(q=(1, 5, 8, 32))
    with pytest.raises(ValueError, match="multiple of key/value heads"):
        mx.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def test_non_float_and_mixed_dtypes():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="query must be float32, float16 or bfloat16"):
        mx.scaled_dot_product_attention(q.long(), k, v)
    with pytest.raises(TypeError, match="share one dtype"):
        mx.scaled_dot_product_attention(q, k.half(), v)
    with pytest.raises(TypeError, match="key must be a torch.Tensor"):
        mx.scaled_dot_product_attention(q, k.numpy(), v)


def test_devices_differ():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="one device"):
        mx.scaled_dot_product_attention(q, k.to("meta"), v)


def test_masks():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="does not broadcast"):
        mx.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(3, 8, dtype=torch.bool))
    with pytest.raises(TypeError, match="attn_mask must be bool"):
        mx.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.int32))
    with pytest.raises(ValueError, match="not both"):
        mx.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool), is_causal=True)


def test_dropout_refused():
    with pytest.raises(ValueError, match="dropout_p must be 0"):
        mx.scaled_dot_product_attention(*_qkv(), dropout_p=0.1)


def test_methods():
    with pytest.raises(ValueError, match="unknown method 'mxfp3'"):
        mx.scaled_dot_product_attention(*_qkv(), method="mxfp3")
    with pytest.raises(ValueError, match="block_n must be a multiple of 32"):
        mx.get_method("mxattention").with_tiles(block_n=48)
    with pytest.raises(ValueError, match="QuantSpec.format"):
        mx.QuantSpec("int4")
    with pytest.raises(ValueError, match="rule"):
        mx.QuantSpec("mxfp4", rule=-1.0)


def test_listing_has_every_preset():
    assert set(mx.list_methods()) >= {
        "fp",
        "mxfp4-ocp",
        "mxfp4-ocp-hadamard",
        "mxfp4-ocp-hadamard-pnq",
        "mxattention",
        "mxattention-no-hadamard",
        "mxfp4-tfs-hadamard-pnq",
        "nvfp4",
        "nvfp4-sage",
    }
