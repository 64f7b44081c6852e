"""NVFP4 against torchao's `nvfp4_quantize` (bytes), hand vectors, conventions."""

from __future__ import annotations

import pytest
import torch

from mxattention.formats import E2M1
from mxattention.formats.nvfp4 import nvfp4_fake_quantize, nvfp4_quantize
from tests.formats.hard_values import hard_values, with_nonfinite

nvfp4_tensor = pytest.importorskip("torchao.prototype.mx_formats.nvfp4_tensor")

N = 131072


def _torchao(x: torch.Tensor, two_level: bool):
    xs = x.float() if x.dtype == torch.float16 else x
    pts = nvfp4_tensor.per_tensor_amax_to_scale(xs.float().abs().amax()) if two_level else None
    s, d = nvfp4_tensor.nvfp4_quantize(xs.contiguous(), block_size=16, per_tensor_scale=pts)
    return s.view(torch.uint8), d.view(torch.uint8), pts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("two_level", [True, False])
def test_bytes_match_torchao(dtype, two_level):
    # NVFP4's block scale spans E4M3's range only: draw block maxima within 2**+-20 of each other
    # (plus zeros, ties, and the hard element patterns), as real activations are.
    x = hard_values(E2M1, N, seed=21, dtype=torch.float32).reshape(-1, 32)
    x = x / x.abs().amax(-1, keepdim=True).clamp(min=1e-30)
    x = x * torch.exp2(torch.randint(-10, 10, (x.shape[0], 1)).float())
    x = x.to(dtype).reshape(-1, 128)
    s, d, pts = _torchao(x, two_level)
    ours = nvfp4_quantize(x, two_level=two_level)
    assert torch.equal(ours.block_scales, s)
    assert torch.equal(ours.data, d)
    if two_level:
        assert torch.equal(ours.tensor_scale, pts)
    assert torch.equal(ours.dequantize(), nvfp4_fake_quantize(x, two_level=two_level))


@pytest.mark.parametrize("two_level", [True, False])
def test_nonfinite_blocks_decode_nan(two_level):
    x = with_nonfinite(torch.randn(64, 64), seed=3, frac=0.002)
    out = nvfp4_fake_quantize(x, two_level=two_level)
    blocks = x.reshape(64, 4, 16)
    bad = ~torch.isfinite(blocks.abs().amax(-1))
    assert bad.any()
    nan_blocks = torch.isnan(out.reshape(64, 4, 16)).all(-1)
    if two_level:
        assert nan_blocks.all()  # a non-finite tensor max poisons the tensor scale
    else:
        assert torch.equal(nan_blocks, bad)
        assert not torch.isnan(out.reshape(64, 4, 16)[~bad]).any()


def test_all_zero_tensor_decodes_zero():
    assert (nvfp4_fake_quantize(torch.zeros(4, 32)) == 0).all()


def test_hand_vector_single_level():
    # amax 6 -> s_b = 1 exactly; 2.5 ties to 2, 5 ties to 4, 7 is never above amax.
    x = torch.tensor([6.0, 2.5, 5.0, -1.25, 0.2] + [0.0] * 11)
    out = nvfp4_fake_quantize(x, two_level=False)
    assert out[:5].tolist() == [6.0, 2.0, 4.0, -1.0, 0.0]


def test_hand_vector_two_level_block_scale():
    # Tensor amax 2688 -> s_t = 1; a block with amax 12 gets s_b = E4M3(2) = 2.
    x = torch.zeros(32)
    x[0] = 2688.0
    x[16] = 12.0
    x[17] = 3.0
    q = nvfp4_quantize(x)
    assert float(q.tensor_scale) == 1.0
    s_b = q.block_scales.view(torch.float8_e4m3fn).float().tolist()
    assert s_b == [448.0, 2.0]
    assert nvfp4_fake_quantize(x)[16:18].tolist() == [12.0, 3.0]


def test_ragged_and_axis():
    x = torch.randn(20, 3)
    out = nvfp4_fake_quantize(x, axis=0)
    assert out.shape == x.shape
    assert nvfp4_quantize(x, axis=0).block_scales.shape == (3, 2)
