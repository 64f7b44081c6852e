"""merge_attention: chunked keys merged equal one pass (fp), empty chunks, bad input."""

from __future__ import annotations

import itertools

import pytest
import torch

import mxattention as mx


@pytest.mark.parametrize("chunks", [2, 3, 5])
def test_fp_chunks_merge_to_one_pass(chunks):
    q, k, v = torch.randn(1, 2, 30, 64), torch.randn(1, 2, 250, 64), torch.randn(1, 2, 250, 64)
    out, lse = mx.scaled_dot_product_attention(q, k, v, method="fp", return_lse=True)
    bounds = torch.linspace(0, 250, chunks + 1).long().tolist()
    parts = [
        mx.scaled_dot_product_attention(q, k[..., a:b, :], v[..., a:b, :], method="fp", return_lse=True)
        for a, b in itertools.pairwise(bounds)
    ]
    m, ml = mx.merge_attention([p[0] for p in parts], [p[1] for p in parts])
    torch.testing.assert_close(m, out, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ml, lse, rtol=1e-5, atol=1e-5)


def test_empty_chunk_gets_no_weight():
    o1, l1 = torch.randn(1, 4, 8), torch.randn(1, 4)
    o2, l2 = torch.randn(1, 4, 8), torch.full((1, 4), -float("inf"))
    m, ml = mx.merge_attention([o1, o2], [l1, l2])
    torch.testing.assert_close(m, o1)
    torch.testing.assert_close(ml, l1)
    m, ml = mx.merge_attention([o2 * 0, o2], [l2, l2])
    assert (m == 0).all() and torch.isneginf(ml).all()


def test_bad_input():
    with pytest.raises(ValueError, match="non-empty"):
        mx.merge_attention([], [])
    with pytest.raises(ValueError, match="lses\\[0\\] has shape"):
        mx.merge_attention([torch.randn(2, 3, 4)], [torch.randn(2, 4)])
