"""Hadamard rotation: orthogonal, equal to the dense product, an involution, clear errors."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mxattention.rotation import fwht, hadamard_block_size, hadamard_matrix, rotate, rotation_matrix

POW2 = [2**k for k in range(9)]  # 1 .. 256
HEAD_DIMS = [32, 64, 80, 96, 128, 256]


@pytest.mark.parametrize("n", POW2)
def test_hadamard_orthogonal_symmetric_pm_entries(n):
    h = hadamard_matrix(n, dtype=torch.float64)
    torch.testing.assert_close(h @ h.T, torch.eye(n, dtype=torch.float64), rtol=0, atol=1e-12)
    assert torch.equal(h, h.T)
    assert torch.all((h.abs() - n**-0.5).abs() < 1e-15)


def test_hadamard_sylvester_layout_and_dtype():
    h2 = torch.tensor([[1.0, 1.0], [1.0, -1.0]]) / 2**0.5
    torch.testing.assert_close(hadamard_matrix(2), h2)
    h4 = hadamard_matrix(4, dtype=torch.float64) * 2
    assert torch.equal(h4[:2, 2:], h4[:2, :2]) and torch.equal(h4[2:, 2:], -h4[:2, :2])
    assert hadamard_matrix(8, dtype=torch.bfloat16).dtype == torch.bfloat16


@pytest.mark.parametrize("shape", [(64,), (3, 32), (2, 4, 5, 128), (1, 1, 256)])
def test_fwht_equals_dense_product_fp32(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    ref = (x.double() @ hadamard_matrix(shape[-1], dtype=torch.float64)).float()
    torch.testing.assert_close(fwht(x), ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [(torch.bfloat16, 2e-2), (torch.float16, 2e-3)])
def test_fwht_half_precision(dtype, tol):
    x = torch.randn(4, 3, 128, generator=torch.Generator().manual_seed(1))
    y = fwht(x.to(dtype))
    assert y.dtype == dtype and y.shape == x.shape
    ref = x.to(dtype).double() @ hadamard_matrix(128, dtype=torch.float64)
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)


def test_hadamard_block_sizes():
    assert [hadamard_block_size(d) for d in (32, 64, 80, 96, 128, 160, 36, 1)] == [
        32,
        64,
        16,
        32,
        128,
        32,
        4,
        1,
    ]


@pytest.mark.parametrize("d", HEAD_DIMS)
def test_rotate_preserves_inner_products_and_is_involution(d):
    gen = torch.Generator().manual_seed(d)
    q, k = torch.randn(2, 3, 17, d, generator=gen), torch.randn(2, 3, 19, d, generator=gen)
    s, s_rot = q @ k.transpose(-1, -2), rotate(q) @ rotate(k).transpose(-1, -2)
    torch.testing.assert_close(s_rot, s, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(rotate(rotate(q)), q, rtol=1e-5, atol=1e-5)
    r = rotation_matrix(d, dtype=torch.float64)
    torch.testing.assert_close(r @ r.T, torch.eye(d, dtype=torch.float64), rtol=0, atol=1e-12)
    torch.testing.assert_close(rotate(q), (q.double() @ r).float(), rtol=1e-5, atol=1e-5)


def test_rotate_small_power_of_two_uses_full_hadamard():
    x = torch.randn(5, 4, dtype=torch.float64)
    torch.testing.assert_close(rotate(x), x @ hadamard_matrix(4, dtype=torch.float64))


def test_rotate_non_power_of_two_mixes_only_within_blocks():
    x = torch.zeros(80)
    x[20] = 1.0  # inside the second block of 16
    y = rotate(x)
    assert torch.count_nonzero(y[16:32]) == 16 and torch.count_nonzero(y) == 16


@settings(max_examples=25, deadline=None)
@given(lead=st.lists(st.integers(1, 3), max_size=3), d=st.sampled_from([8, 16, 48, 80, 96, 128]))
def test_rotate_norm_preserving_any_leading_shape(lead, d):
    x = torch.randn(*lead, d, dtype=torch.float64)
    y = rotate(x)
    assert y.shape == x.shape and y.dtype == x.dtype
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=1e-12)


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="head dim 36"):
        rotate(torch.randn(2, 36))
    with pytest.raises(ValueError, match="head dim 36"):
        rotation_matrix(36)
    with pytest.raises(TypeError, match="x must be a floating-point"):
        rotate(torch.ones(4, 32, dtype=torch.int32))
    with pytest.raises(TypeError, match="x must be a floating-point"):
        fwht(torch.ones(32, dtype=torch.int64))
    with pytest.raises(ValueError, match="0-dim"):
        rotate(torch.tensor(1.0))
    with pytest.raises(TypeError, match=r"torch\.Tensor"):
        rotate([1.0, 2.0])
    with pytest.raises(ValueError, match="power of two"):
        fwht(torch.randn(3, 80))
    with pytest.raises(ValueError, match="power of two"):
        hadamard_matrix(12)
    with pytest.raises(TypeError, match="n must be an int"):
        hadamard_matrix(8.0)


def test_rotation_block_matches_the_matrix_and_refuses_what_rotate_refuses():
    from mxattention.rotation import rotation_block, rotation_matrix

    for d, b in ((128, 128), (80, 16), (96, 32), (160, 32), (8, 8)):
        assert rotation_block(d) == b
        r = rotation_matrix(d)
        assert torch.count_nonzero(r[:b, b:]) == 0 and torch.count_nonzero(r[:b, :b]) == b * b
    with pytest.raises(ValueError, match="head dim 36"):
        rotation_block(36)
