"""Bad arguments raise TypeError / ValueError naming the argument."""

from __future__ import annotations

import pytest
import torch

from mxattention.formats.mx import fake_quantize, mx_quantize
from mxattention.formats.nvfp4 import nvfp4_fake_quantize, nvfp4_quantize

CASTS = [fake_quantize, mx_quantize]


@pytest.mark.parametrize("cast", CASTS + [nvfp4_quantize, nvfp4_fake_quantize])
def test_integer_tensor(cast):
    with pytest.raises(TypeError, match="x must be float32, float16 or bfloat16"):
        cast(torch.arange(32))


@pytest.mark.parametrize("cast", CASTS + [nvfp4_quantize, nvfp4_fake_quantize])
def test_not_a_tensor(cast):
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        cast([1.0, 2.0])


@pytest.mark.parametrize("cast", CASTS + [nvfp4_quantize, nvfp4_fake_quantize])
@pytest.mark.parametrize("axis", [2, -3, 10])
def test_axis_out_of_range(cast, axis):
    with pytest.raises(ValueError, match=f"axis={axis} is out of range"):
        cast(torch.randn(4, 32), axis=axis)


@pytest.mark.parametrize("cast", CASTS)
def test_axis_not_int(cast):
    with pytest.raises(TypeError, match="axis must be an int"):
        cast(torch.randn(4, 32), axis=1.0)


@pytest.mark.parametrize("cast", CASTS)
@pytest.mark.parametrize("bs", [0, -32, 3, 31])
def test_block_size(cast, bs):
    with pytest.raises(ValueError, match="block_size must be a positive multiple of 2"):
        cast(torch.randn(64), block_size=bs)


@pytest.mark.parametrize("cast", CASTS)
@pytest.mark.parametrize("q", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_boundary(cast, q):
    with pytest.raises(ValueError, match="rule"):
        cast(torch.randn(64), rule=q)


@pytest.mark.parametrize("cast", CASTS)
def test_unknown_rule(cast):
    with pytest.raises(ValueError, match="rule must be one of"):
        cast(torch.randn(64), rule="round")
    with pytest.raises(TypeError, match="rule must be"):
        cast(torch.randn(64), rule=None)


@pytest.mark.parametrize("cast", CASTS)
def test_unknown_ladder(cast):
    with pytest.raises(ValueError, match="elem must be one of"):
        cast(torch.randn(64), elem="e3m4")


def test_zero_dim():
    with pytest.raises(ValueError, match="at least one dimension"):
        fake_quantize(torch.tensor(1.0))
