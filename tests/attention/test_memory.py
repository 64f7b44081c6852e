"""No Lq x Lk matrix is formed: the largest tensor the reference creates is one score tile."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mxattention as mx
from mxattention.attention import reference


class LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("method", ["fp", "mxattention", "nvfp4-sage"])
def test_largest_tensor_is_a_tile(method, monkeypatch):
    monkeypatch.setattr(reference, "MAX_TILE_ELEMENTS", 1 << 14)
    lq = lk = 1024
    q, k, v = (torch.randn(1, 1, lq, 64) for _ in range(3))
    with LargestTensor() as probe:
        mx.scaled_dot_product_attention(q, k, v, method=method)
    # A tile is rows x block_n <= 2**14 elements; operands are L x D = 65536. L x L would be 2**20.
    assert probe.largest <= max(1 << 14, lq * 64)
    assert probe.largest < lq * lk // 8
