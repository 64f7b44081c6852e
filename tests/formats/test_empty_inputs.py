"""Zero-size tensors through every cast: empty results of the right shape, as torch's ops give."""

from __future__ import annotations

import pytest
import torch

from mxattention.formats import fake_quantize, mx_quantize, nvfp4_fake_quantize, nvfp4_quantize

SHAPES = [((0, 32), -1), ((4, 0), -1), ((4, 0), 0), ((0,), 0), ((2, 0, 32), -1), ((2, 0, 32), 1)]


@pytest.mark.parametrize("shape,axis", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mx_casts_of_empty_tensors(shape, axis, dtype):
    x = torch.zeros(shape, dtype=dtype)
    for rule in ("ocp", "uos"):
        y = fake_quantize(x, axis, rule=rule)
        assert y.shape == x.shape and y.dtype == dtype
        assert mx_quantize(x, axis, rule=rule).dequantize().shape == x.shape


@pytest.mark.parametrize("shape,axis", SHAPES)
@pytest.mark.parametrize("two_level", [True, False])
def test_nvfp4_casts_of_empty_tensors(shape, axis, two_level):
    """Two-level scaling took amax() of the whole tensor, which torch refuses on an empty one."""
    x = torch.zeros(shape)
    y = nvfp4_fake_quantize(x, axis, two_level=two_level)
    assert y.shape == x.shape and y.dtype == x.dtype
    t = nvfp4_quantize(x, axis, two_level=two_level)
    assert t.dequantize().shape == x.shape
    if two_level:
        assert t.tensor_scale == 1.0  # the all-zero convention
