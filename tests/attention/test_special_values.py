"""Edge values at the entry: fp16 outputs near the dtype's maximum stay finite (docs/design.md,
'Special values and overflow'), and the casts behave there as documented."""

from __future__ import annotations

import math

import pytest
import torch

from mxattention.attention.config import get_method
from mxattention.attention.reference import cast_output, flush_subnormals, reference_attention
from mxattention.attention.sdpa import sdpa_reference
from mxattention.formats.mx import fake_quantize


def test_cast_output_saturates_finite_values_only():
    x = torch.tensor([65504.0, 65536.0, 1e30, -7e4, float("nan"), float("inf"), 1.5])
    y = cast_output(x, torch.float16)
    assert y.dtype == torch.float16
    assert y[:4].tolist() == [65504.0, 65504.0, 65504.0, -65504.0] and y[6] == 1.5
    assert y[4].isnan() and y[5] == 65504.0  # fp32 Inf cannot come from finite fp16 operands
    assert cast_output(torch.tensor([3.4e38]), torch.bfloat16).isfinite().all()
    x32 = torch.tensor([3.0e38])
    assert cast_output(x32, torch.float32) is x32


def _near_max(value: float, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, 2, 16, 32, generator=g).half()
    k = torch.randn(1, 2, 40, 32, generator=g).half()
    v = torch.full((1, 2, 40, 32), value, dtype=torch.float16)
    v[..., ::2] *= -1
    return q, k, v


@pytest.mark.parametrize("value", [6e4, 57344.0, 65504.0])
@pytest.mark.parametrize("method", ["mxattention", "mxfp4-tfs-hadamard-pnq"])
def test_fp16_v_near_max_gives_a_finite_output(value, method):
    """The exact answer is V (constant columns); UOS / TFS round 65504 and 6e4 to 65536, which a
    rounding cast to fp16 makes Inf. The output saturates: within one quantization step of V."""
    q, k, v = _near_max(value)
    assert fake_quantize(v, -2, rule="uos").isinf().any() or value == 57344.0  # the hazard is real
    out = sdpa_reference(q, k, v, method=method)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    assert ((out.float() - v[:, :, :16].float()).abs() <= 0.25 * value).all()


def test_fp16_large_scores_and_v_near_max():
    """Q, K ~ 150 (scores ~ 1e5, nearly one-hot weights) with V = +-6e4: every element was Inf."""
    g = torch.Generator().manual_seed(1)
    q = (150 * torch.randn(1, 1, 64, 64, generator=g)).clamp(-6e4, 6e4).half()
    k = (150 * torch.randn(1, 1, 64, 64, generator=g)).clamp(-6e4, 6e4).half()
    v = ((torch.rand(1, 1, 64, 64, generator=g) > 0.5).half() * 2 - 1) * 6e4
    out = sdpa_reference(q, k, v, method="mxattention")
    assert torch.isfinite(out).all()
    assert (out.float().abs() <= 65504).all() and (out.float().abs() >= 3e4).float().mean() > 0.9


def test_subnormal_exps_are_zero():
    """P~ and alpha below 2**-126 are 0, as NVIDIA's exp2 (ex2.approx.ftz) gives them in the kernels
    (docs/design.md, 'Special values and overflow'): keys 127.5 binades under the row max weigh
    exactly nothing, even times V = 2**120 (unflushed they would add ~2**-7.5 to O), so O equals
    the call with those keys masked out; keys 125 binades down still count."""
    x = torch.tensor([2.0**-126, 2.0**-126 * (1 - 2.0**-23), 2.0**-149, 0.0, float("nan"), 1.0])
    got = flush_subnormals(x)
    assert got[[0, 5]].tolist() == [2.0**-126, 1.0] and (got[1:4] == 0).all() and got[4].isnan()
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 8, 16, generator=g)
    k, v = (torch.randn(1, 1, 20, 16, generator=g) for _ in range(2))
    k[..., 10:, :] = 0.0  # scores 0, moved by the mask to `binades` under each row's max
    v[..., 10:, :] = 2.0**120
    row_max = (q @ k[..., :10, :].transpose(-1, -2)).amax(-1, keepdim=True)
    for binades, counts in ((127.5, False), (125.0, True)):
        mask = torch.zeros(1, 1, 8, 20)
        mask[..., 10:] = row_max - binades * math.log(2.0)
        out, _ = reference_attention(q, k, v, get_method("fp"), mask=mask, scale=1.0)
        cut = mask.clone()
        cut[..., 10:] = -float("inf")
        alone, _ = reference_attention(q, k, v, get_method("fp"), mask=cut, scale=1.0)
        assert torch.equal(out, alone) != counts, binades
