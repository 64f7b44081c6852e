"""Folding MX values into E4M3 (`formats.fold`, docs/fast_mode.md): bit for bit against an
independent float64 / torch-float8 reference, and the exact range [-8, 6] of the binade shift."""

from __future__ import annotations

import math

import pytest
import torch

from mxattention.formats.fold import FOLD_EXACT_EXPS, fold, fold_outside, fold_p, unfold
from mxattention.formats.ladders import E2M1
from mxattention.formats.mx import fake_quantize


def _is_e4m3(v: float) -> bool:
    t = torch.tensor([v], dtype=torch.float64)
    return t.to(torch.float8_e4m3fn).double().item() == v


def test_e2m1_times_2k_is_e4m3_exactly_for_k_in_range():
    lo, hi = FOLD_EXACT_EXPS
    for k in range(lo, hi + 1):
        assert all(_is_e4m3(c * 2.0**k) for c in E2M1.magnitudes), k
    # The range is tight: one binade further either way loses a value.
    assert not all(_is_e4m3(c * 2.0 ** (lo - 1)) for c in E2M1.magnitudes)
    assert not all(_is_e4m3(c * 2.0 ** (hi + 1)) for c in E2M1.magnitudes)


def _reference_fold(x: torch.Tensor, dims: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """Written differently: Python floats for the anchor (log2, then corrected to the floor), float64
    division, torch's own float8_e4m3fn cast (round to nearest even) for the rounding."""
    xd = x.double()
    amax = torch.where(torch.isfinite(xd), xd.abs(), 0.0).amax(dim=dims, keepdim=True)
    a = torch.empty(amax.shape, dtype=torch.int64)
    for i, m in enumerate(amax.flatten().tolist()):
        if m == 0:
            a.view(-1)[i] = 0
            continue
        e = math.floor(math.log2(m))
        while 2.0**e > m:
            e -= 1
        while 2.0 ** (e + 1) <= m:
            e += 1
        a.view(-1)[i] = e - 8
    scaled = xd / torch.pow(2.0, a.double())
    f = scaled.float().to(torch.float8_e4m3fn).float()
    return torch.where(torch.isnan(x), float("nan"), f), a.int()


def _mx_values(shape, spread: int, seed: int, axis: int = -1) -> torch.Tensor:
    """E2M1 MX values (UOS, blocks of 32 along `axis`) of Gaussian data whose 32-blocks are scaled by
    2**U(-spread, spread): block scales spanning up to 2 spread binades in one row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    xb = x.movedim(axis, -1)
    n = xb.shape[-1]
    exps = torch.randint(-spread, spread + 1, (*xb.shape[:-1], -(-n // 32)), generator=g).float()
    xb = xb * torch.repeat_interleave(torch.exp2(exps), 32, dim=-1)[..., :n]
    return fake_quantize(xb.movedim(-1, axis).contiguous(), axis)


@pytest.mark.parametrize("dims", [(-1,), (-2,), (-2, -1)])
def test_fold_matches_the_independent_reference_bit_for_bit(dims):
    x = _mx_values((2, 3, 37, 70), spread=10, seed=1)
    x[0, 0, 3, 5] = float("nan")
    x[1, 2, 4] = 0.0  # an all-zero row: anchor 0
    f, a = fold(x, dims)
    rf, ra = _reference_fold(x, dims)
    assert torch.equal(a, ra)
    assert torch.equal(f.view(torch.int32), rf.view(torch.int32)) or torch.equal(
        torch.nan_to_num(f, nan=7.0), torch.nan_to_num(rf, nan=7.0)
    )
    # f holds E4M3 values: the float8 cast keeps every one.
    assert torch.equal(
        torch.nan_to_num(f.to(torch.float8_e4m3fn).float(), nan=7.0), torch.nan_to_num(f, nan=7.0)
    )


def test_fold_of_raw_float_data_matches_the_reference_too():
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 67, generator=g) * torch.exp2(torch.randint(-30, 30, (5, 1), generator=g).float())
    f, a = fold(x, (-1,))
    rf, ra = _reference_fold(x, (-1,))
    assert torch.equal(a, ra) and torch.equal(f, rf)


def test_blocks_within_14_binades_of_the_top_fold_exactly_and_the_rest_is_reported():
    x = _mx_values((4, 64, 96), spread=12, seed=3, axis=-2)  # V-like: blocks along the keys
    f, a = fold(x, (-2,))  # per column
    out = fold_outside(x, f, a, block_dim=-2)
    back = unfold(f, a)
    assert torch.equal(back[~out["elements"]], x[~out["elements"]])
    # Block exponents of each column: the top block's is a + 6 - (0 or 1); blocks scaled within
    # 14 binades of a + 6 are exact, so every inexact block lies further down.
    xb = x.movedim(-2, -1).unflatten(-1, (-1, 32))
    _m, e = torch.frexp(xb.abs().amax(-1))
    e_blk = e - 1 - 2  # floor(log2 blockmax) - 2: the scale exponent of E2M1 values (max 4 or 6)
    a_col = a.movedim(-2, -1)
    assert bool((e_blk[out["blocks"]] < (a_col.expand_as(e_blk) + 6 - 14)[out["blocks"]]).all())
    assert out["blocks"].any(), "spread 24 binades must leave some blocks outside"
    assert torch.equal(out["groups"], out["elements"].any(dim=-2, keepdim=True))


def test_fold_p_is_exact_for_blocks_scaled_at_least_2_to_minus_16():
    g = torch.Generator().manual_seed(4)
    p = torch.rand(8, 256, generator=g) * torch.exp2(-torch.randint(0, 24, (8, 256), generator=g).float())
    p[:, 0] = 1.0
    p[:, 64:96] *= 2.0**-22  # a block ~24 binades down
    p_hat = fake_quantize(p, -1)
    fp = fold_p(p_hat)
    ref = (p_hat.double() * 256).float().to(torch.float8_e4m3fn).float()
    assert torch.equal(fp, ref)
    blocks = p_hat.unflatten(-1, (-1, 32))
    _m, e = torch.frexp(blocks.amax(-1))
    scale_exp = e - 1 - 2
    exact = (fp.unflatten(-1, (-1, 32)) / 256 == blocks).all(-1)
    assert bool(exact[(scale_exp >= -16) & (blocks.amax(-1) > 0)].all())
    assert not bool(exact.all()), "tiny blocks must round"
