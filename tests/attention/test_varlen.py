"""`varlen_attention` on the reference: per-sequence dense calls bit for bit, O(total) memory, checks."""

from __future__ import annotations

import pytest
import torch

import mxattention as mx
from mxattention.attention import reference
from mxattention.attention.sdpa import sdpa_reference
from mxattention.attention.varlen import spans

from .test_memory import LargestTensor

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # the reference-fallback warning


def packed(lens_q, lens_k, hq=2, hk=2, d=32, dv=None, *, seed=0, dtype=torch.float32):
    """Packed q, k, v with outliers (a V spike at each sequence's first key) and the prefix sums."""
    g = torch.Generator().manual_seed(seed)
    tq, tk = sum(lens_q), sum(lens_k)
    q = torch.randn(tq, hq, d, generator=g) * torch.exp(torch.randn(d, generator=g))
    k = torch.randn(tk, hk, d, generator=g) + 2.0 * torch.randn(d, generator=g)
    v = torch.randn(tk, hk, dv or d, generator=g)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    v[cu_k[:-1][torch.tensor(lens_k) > 0].long()] *= 50.0  # would move a neighbour's V block scale
    return q.to(dtype), k.to(dtype), v.to(dtype), cu_q, cu_k


def per_sequence(q, k, v, cu_q, cu_k, dense, **kw):
    """(O, lse) of one dense call per sequence, in the packed layouts; no-key rows O = 0, lse = -inf."""
    out = torch.zeros(q.shape[0], q.shape[1], v.shape[2], dtype=q.dtype)
    lse = torch.full((q.shape[1], q.shape[0]), -float("inf"))
    for q0, q1, k0, k1 in spans(cu_q.tolist(), cu_k.tolist()):
        if q1 > q0 and k1 > k0:
            o, l = dense(
                *(x[a:b].permute(1, 0, 2)[None] for x, a, b in ((q, q0, q1), (k, k0, k1), (v, k0, k1))), **kw
            )
            out[q0:q1], lse[:, q0:q1] = o[0].permute(1, 0, 2), l[0]
    return out, lse


CASES = {
    "empty_and_odd": ([5, 0, 40, 65, 3], [7, 13, 0, 70, 33]),
    "one_sequence": ([77], [100]),
    "many_short": ([1, 2, 3, 1, 4, 2, 1, 3], [2, 1, 5, 1, 3, 33, 1, 2]),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("method", ["mxattention", "mxfp4-ocp", "fp", "nvfp4-sage"])
def test_equals_per_sequence_dense_reference(case, method):
    q, k, v, cu_q, cu_k = packed(*CASES[case], hq=4, hk=2)
    out, lse = mx.varlen_attention(q, k, v, cu_q, cu_k, method=method, return_lse=True)
    want_o, want_l = per_sequence(
        q, k, v, cu_q, cu_k, sdpa_reference, method=method, enable_gqa=True, return_lse=True
    )
    assert out.shape == (q.shape[0], 4, 32) and lse.shape == (4, q.shape[0])
    assert torch.equal(out, want_o) and torch.equal(lse, want_l)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_causal_top_left_per_sequence(dtype):
    # Lq < Lk, Lq > Lk and Lq = Lk: causal is torch SDPA's top-left alignment in each sequence.
    q, k, v, cu_q, cu_k = packed([30, 50, 40], [70, 20, 40], d=64, dv=32, seed=1, dtype=dtype)
    out, lse = mx.varlen_attention(q, k, v, cu_q, cu_k, is_causal=True, return_lse=True)
    want_o, want_l = per_sequence(q, k, v, cu_q, cu_k, sdpa_reference, is_causal=True, return_lse=True)
    assert out.dtype == dtype
    assert torch.equal(out, want_o) and torch.equal(lse, want_l)


def test_no_key_rows_and_empty_batch():
    q, k, v, cu_q, cu_k = packed([4, 6], [0, 9])
    out, lse = mx.varlen_attention(q, k, v, cu_q, cu_k, return_lse=True)
    assert (out[:4] == 0).all() and torch.isneginf(lse[:, :4]).all() and torch.isfinite(lse[:, 4:]).all()
    empty = torch.zeros(0, 2, 32)
    zeros = torch.zeros(3, dtype=torch.int32)
    out, lse = mx.varlen_attention(empty, empty, empty, zeros, zeros, return_lse=True)
    assert out.shape == (0, 2, 32) and lse.shape == (2, 0)


def test_sequences_are_independent():
    # Changing one sequence's keys changes no other sequence's output.
    q, k, v, cu_q, cu_k = packed([33, 20, 40], [41, 35, 64])
    out = mx.varlen_attention(q, k, v, cu_q, cu_k)
    v2 = v.clone()
    v2[41:76] = 1e4
    out2 = mx.varlen_attention(q, k, v2, cu_q, cu_k)
    assert torch.equal(out[:33], out2[:33]) and torch.equal(out[53:], out2[53:])
    assert not torch.equal(out[33:53], out2[33:53])


def test_memory_is_per_sequence(monkeypatch):
    # No padded [B, max_len, ...] tensor and no L x L matrix: the largest tensor is an operand.
    monkeypatch.setattr(reference, "MAX_TILE_ELEMENTS", 1 << 12)
    lens = [700, 3, 5, 2, 10]
    q, k, v, cu_q, cu_k = packed(lens, lens, hq=1, hk=1, d=32)
    with LargestTensor() as probe:
        mx.varlen_attention(q, k, v, cu_q, cu_k)
    assert probe.largest <= max(1 << 12, sum(lens) * 32)
    assert probe.largest < 700 * 700


def test_compiles_to_one_node():
    q, k, v, cu_q, cu_k = packed([5, 40, 17], [9, 33, 50], seed=2)

    def f(q, k, v, cu_q, cu_k):
        return mx.varlen_attention(q, k, v, cu_q, cu_k, max_seqlen_q=40, max_seqlen_k=50, return_lse=True)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="aot_eager", fullgraph=True)
    out, lse = compiled(q, k, v, cu_q, cu_k)
    want_o, want_l = f(q, k, v, cu_q, cu_k)
    assert torch.equal(out, want_o) and torch.equal(lse, want_l)


def test_backward_raises_inference_only():
    q, k, v, cu_q, cu_k = packed([5, 7], [6, 8])
    q.requires_grad_(True)
    out = mx.varlen_attention(q, k, v, cu_q, cu_k)
    with pytest.raises(RuntimeError, match="inference-only"):
        out.sum().backward()


def _call(**over):
    q, k, v, cu_q, cu_k = packed([3, 5], [4, 6])
    args = dict(q=q, k=k, v=v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    args.update(over)
    return mx.varlen_attention(**args)


I32 = torch.int32


@pytest.mark.parametrize(
    ("over", "error", "match"),
    [
        ({"cu_seqlens_q": torch.tensor([0, 3, 8])}, TypeError, "cu_seqlens_q must be int32"),
        ({"cu_seqlens_k": [0, 4, 10]}, TypeError, "cu_seqlens_k must be a torch.Tensor"),
        ({"cu_seqlens_q": torch.tensor([[0, 3, 8]], dtype=I32)}, ValueError, "cu_seqlens_q must be 1-D"),
        ({"cu_seqlens_q": torch.tensor([0], dtype=I32)}, ValueError, "num_seqs >= 1"),
        ({"cu_seqlens_k": torch.tensor([0, 10], dtype=I32)}, ValueError, "same number of sequences"),
        ({"cu_seqlens_q": torch.tensor([1, 3, 8], dtype=I32)}, ValueError, "cu_seqlens_q must start at 0"),
        ({"cu_seqlens_k": torch.tensor([0, 7, 6], dtype=I32)}, ValueError, r"non-decreasing.*\[2\] = 6"),
        ({"cu_seqlens_q": torch.tensor([0, 3, 7], dtype=I32)}, ValueError, r"\[-1\] = 7 must equal q.shape"),
        ({"cu_seqlens_k": torch.tensor([0, 4, 11], dtype=I32)}, ValueError, r"must equal k.shape\[0\] = 10"),
        ({"max_seqlen_q": 4}, ValueError, "max_seqlen_q = 4 is less than the longest sequence, 5"),
        ({"max_seqlen_k": 5.0}, TypeError, "max_seqlen_k must be a non-negative int"),
        ({"q": torch.randn(8, 2, 16)}, ValueError, "k head_dim 32 must equal q head_dim 16"),
        ({"q": torch.randn(8, 3, 32)}, ValueError, r"q heads \(3\) must be a multiple"),
        ({"q": torch.randn(1, 8, 2, 32)}, ValueError, "q must be 3-D"),
        ({"v": torch.randn(10, 2, 32, dtype=torch.float16)}, TypeError, "share one dtype"),
        ({"k": torch.randn(10, 2, 32).int()}, TypeError, "k must be float32"),
        ({"v": torch.randn(9, 2, 32)}, ValueError, "same total_tokens"),
        ({"v": torch.randn(10, 1, 32)}, ValueError, "same number of heads"),
        ({"scale": "1"}, TypeError, "scale must be a float"),
        ({"is_causal": 1}, TypeError, "is_causal must be a bool"),
        ({"method": "nope"}, ValueError, "nope"),
    ],
)
def test_bad_input(over, error, match):
    with pytest.raises(error, match=match):
        _call(**over)
