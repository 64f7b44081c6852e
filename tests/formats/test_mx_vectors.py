"""Hand-computed vectors: UOS (which no other library has), OCP and TFS, padding, NaN/Inf, layout."""

from __future__ import annotations

import pytest
import torch

from mxattention.formats.mx import fake_quantize, mx_quantize


def _block(first: float, rest: float = 1.0) -> torch.Tensor:
    x = torch.full((32,), rest)
    x[0] = first
    return x


def test_uos_boundary_7_25_keeps_scale_one():
    mx = mx_quantize(_block(7.25, 0.3), rule="uos")
    assert int(mx.scales) == 127  # 2**0
    out = mx.dequantize()
    assert out[0] == 6.0  # clipped
    assert (out[1:] == 0.5).all()  # 0.3 -> 0.5: small values keep their resolution


def test_uos_just_above_boundary_doubles_scale():
    mx = mx_quantize(_block(7.26, 0.3), rule="uos")
    assert int(mx.scales) == 128  # 2**1
    out = mx.dequantize()
    assert out[0] == 8.0  # 7.26 / 2 = 3.63 -> 4
    assert (out[1:] == 0.0).all()  # 0.3 / 2 = 0.15 underflows to 0


@pytest.mark.parametrize(
    ("m", "ocp", "tfs", "uos"),
    [
        (4.0, 127, 127, 127),  # OCP floor(log2 4) - 2 = 0; TFS ceil(log2 4/6) = 0; UOS 0
        (6.0, 127, 127, 127),
        (6.5, 127, 128, 127),
        (7.0, 127, 128, 127),
        (7.25, 127, 128, 127),
        (7.5, 127, 128, 128),
        (8.0, 128, 128, 128),
        (3.0, 126, 126, 126),  # 3 = 6 * 2**-1 and 3 <= 7.25 * 2**-1
        (3.625, 126, 127, 126),  # 3.625 = 7.25 / 2: UOS keeps e = -1
        (3.626, 126, 127, 127),
        (0.75, 124, 124, 124),
    ],
)
def test_scale_bytes_by_hand(m, ocp, tfs, uos):
    for rule, want in (("ocp", ocp), ("tfs", tfs), ("uos", uos)):
        assert int(mx_quantize(_block(m, 0.0), rule=rule).scales) == want, (rule, m)


def test_uos_range_lower_end():
    # The normalized max lies in (3.625, 7.25]: M = 3.625 normalizes to 7.25 at e = -1.
    assert int(mx_quantize(_block(3.625, 0.0), rule="uos").scales) == 126
    assert int(mx_quantize(_block(3.6251, 0.0), rule="uos").scales) == 127


def test_e2m1_ties_to_even_and_saturation():
    vals = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 7.0, -0.25, -5.0, 0.2, 6.0])
    x = torch.zeros(32)
    x[: len(vals)] = vals
    x[31] = 4.0  # pins the OCP scale at 1 (max 7 -> floor(log2 7) - 2 = 0)
    out = fake_quantize(x, rule="ocp")[: len(vals)]
    want = torch.tensor([0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0, -0.0, -4.0, 0.0, 6.0])
    assert torch.equal(out, want)
    assert torch.signbit(out[8])  # -0.25 -> -0


def test_packed_nibbles_even_low():
    x = torch.zeros(32)
    x[0], x[1] = 1.0, -6.0  # codes 0b0010 and 0b1111
    x[31] = 4.0
    mx = mx_quantize(x, rule="ocp")
    assert mx.data.shape == (16,)
    assert int(mx.data[0]) == 0x2 | (0xF << 4)


def test_all_zero_block_scale_one():
    mx = mx_quantize(torch.zeros(64), rule="uos")
    assert mx.scales.tolist() == [127, 127]
    assert (mx.dequantize() == 0).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_marks_block_nan(bad):
    x = torch.ones(64)
    x[40] = bad
    mx = mx_quantize(x, rule="uos")
    assert mx.scales.tolist() == [125, 0xFF]  # M = 1: ceil(log2(1 / 7.25)) = -2
    out = mx.dequantize()
    assert torch.isnan(out[32:]).all() and (out[:32] == 1).all()
    assert torch.equal(torch.isnan(fake_quantize(x)), torch.isnan(out))


def test_ragged_length_padding_never_leaks():
    x = torch.randn(3, 45)
    mx = mx_quantize(x, rule="uos")
    assert mx.scales.shape == (3, 2) and mx.data.shape == (3, 32)
    out = fake_quantize(x)
    assert out.shape == x.shape
    # The tail block (13 values) is quantized as if alone: padding zeros change nothing.
    assert torch.equal(out[:, 32:], fake_quantize(x[:, 32:].contiguous()))
    assert torch.equal(mx.dequantize(), out)


def test_axis_other_than_last():
    x = torch.randn(64, 5)
    assert torch.equal(fake_quantize(x, axis=0), fake_quantize(x.T.contiguous(), axis=-1).T)
    assert mx_quantize(x, axis=0).scales.shape == (5, 2)


def test_extreme_exponents_clamped():
    tiny = torch.full((32,), 2.0**-149)  # float32's smallest subnormal
    mx = mx_quantize(tiny, rule="uos")
    assert int(mx.scales) == 0  # e = ceil(log2(2**-149 / 7.25)) = -151 -> clamped to -127
    assert (mx.dequantize() == 0).all()  # 2**-149 / 2**-127 = 2**-22 rounds to 0
    big = torch.full((32,), 3.3e38)  # > 7.25 * 2**125 = 3.08e38
    assert int(mx_quantize(big, rule="uos").scales) == 127 + 126
    assert int(mx_quantize(big, rule="ocp").scales) == 127 + 125
    assert int(mx_quantize(big / 1.1, rule="uos").scales) == 127 + 125


def test_inputs_are_not_modified():
    from mxattention.formats.nvfp4 import nvfp4_fake_quantize

    x = torch.randn(4, 64) * 3
    keep = x.clone()
    for cast in (fake_quantize, mx_quantize, nvfp4_fake_quantize):
        cast(x)
        assert torch.equal(x, keep), cast.__name__
