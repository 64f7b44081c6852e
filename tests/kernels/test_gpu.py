"""GPU-only checks (skipped without CUDA): large shapes vs the reference, compile, CUDA graphs."""

import warnings

import pytest
import torch

import mxattention as mx
from mxattention.kernels import op

from .helpers import compare, qkv

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize("path,layout", [("bf16", "bf16"), ("bf16", "packed"), ("dot_scaled", "packed")])
def test_large_matches_reference(path, layout):
    # Before sm_100 Triton emulates tl.dot_scaled (bf16 upcast): slower, same function.
    q, k, v = qkv(1, 4, 4, 2048, 2048, 128, seed=11)
    c = compare(q, k, v, "mxattention", device="cuda", matrix_path=path, kv_layout=layout)
    assert c.rel_l2 <= 1e-3 * c.quant_rel_l2
    assert c.p_differ <= 1e-3 * c.p_decisions


def test_compile_and_cuda_graph():
    q, k, v = (t.cuda().half() for t in qkv(1, 8, 8, 1024, 1024, 128, seed=12))
    with warnings.catch_warnings():
        warnings.simplefilter("error", op.ReferenceFallbackWarning)
        eager = mx.scaled_dot_product_attention(q, k, v)
        compiled = torch.compile(lambda q, k, v: mx.scaled_dot_product_attention(q, k, v), fullgraph=True)
        assert torch.equal(compiled(q, k, v), eager)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            mx.scaled_dot_product_attention(q, k, v)  # warm up (compilation) outside the capture
            with torch.cuda.graph(graph):
                captured = mx.scaled_dot_product_attention(q, k, v)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(captured, eager)
