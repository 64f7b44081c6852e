"""Zero-size dimensions: one semantics for every entry (issue 28, deliverable 2).

torch SDPA accepts every zero-size dim and so does the public entry (`attention.inputs.Shapes.empty`):
an empty O for B, H, Lq or Dv = 0, O = 0 for Lk = 0, and for D = 0 every score 0 (O = the mean of
V^). The patch and the diffusers backends (dense and varlen: each batch row a sequence of
`varlen_attention`, which serves zero heads / head dims too) take the same calls
(`integrations._support`): routed, not fallbacks, even under strict=True, with the public entry's result.
"""

import pytest
import torch
import torch.nn.functional as F

import mxattention
from mxattention.integrations import patch_sdpa

# (B, H, Lq, Lk, D, Dv), each with one zero.
CASES = {
    "batch": (0, 2, 5, 7, 8, 8),
    "heads": (1, 0, 5, 7, 8, 8),
    "q_len": (1, 2, 0, 7, 8, 8),
    "kv_len": (1, 2, 5, 0, 8, 8),
    "head_dim": (1, 2, 5, 7, 0, 8),
    "v_dim": (1, 2, 5, 7, 8, 0),
}


def _qkv(b, h, lq, lk, d, dv):
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(b, h, lq, d, generator=g),
        torch.randn(b, h, lk, d, generator=g),
        torch.randn(b, h, lk, dv, generator=g),
    )


@pytest.mark.parametrize("case", CASES)
def test_zero_size_calls_are_served_alike(case):
    q, k, v = _qkv(*CASES[case])
    want = mxattention.scaled_dot_product_attention(q, k, v, is_causal=True)
    if case not in ("head_dim", "heads"):  # D = 0: the mean of V^, quantized; torch's is the mean of V
        assert torch.equal(want, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    if case == "heads":  # torch 2.11's CPU SDPA dies of SIGFPE on zero heads (2.13 gives this)
        assert want.shape == (1, 0, 5, 8)
    with patch_sdpa("mxattention", strict=True) as patch:
        got = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert torch.equal(got, want)
    assert patch.stats()["routed"] == 1 and patch.stats()["fallback"] == 0

    pytest.importorskip("diffusers")
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    from mxattention.integrations.diffusers_backend import (
        backend_stats,
        register_diffusers_backend,
        register_diffusers_varlen_backend,
        reset_backend_stats,
        reset_varlen_backend_stats,
        varlen_backend_stats,
    )

    bshd = [x.transpose(1, 2) for x in (q, k, v)]  # diffusers' [B, S, H, D]
    for register, reset, stats in (
        (register_diffusers_backend, reset_backend_stats, backend_stats),
        (register_diffusers_varlen_backend, reset_varlen_backend_stats, varlen_backend_stats),
    ):
        name = register("mxattention", name=f"mxattention_zero_size_{register.__name__}", strict=True)
        reset(name)
        got = dispatch_attention_fn(*bshd, is_causal=True, backend=name)
        assert torch.equal(got.transpose(1, 2), want), name
        assert stats(name)["routed"] == 1 and stats(name)["fallback"] == 0
