"""Ladder data and element rounding against torch's own float8 casts (an independent RNE)."""

from __future__ import annotations

import pytest
import torch

from mxattention.formats import E2M1, E4M3, E5M2, LADDERS
from mxattention.formats.rounding import decode_codes, ladder_codes, round_to_ladder


def test_e2m1_ladder():
    assert E2M1.magnitudes == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    assert E2M1.emax == 2 and E2M1.bits == 4


@pytest.mark.parametrize(("ladder", "dtype"), [(E4M3, torch.float8_e4m3fn), (E5M2, torch.float8_e5m2)])
def test_fp8_codes_match_torch_cast(ladder, dtype):
    # Every float32 bit pattern class that matters: random magnitudes across the whole range of
    # the format, exact ladder points and exact midpoints (ties), all within +-max.
    g = torch.Generator().manual_seed(0)
    mags = torch.tensor(ladder.magnitudes)
    mids = (mags[1:] + mags[:-1]) / 2
    rnd = torch.exp2(torch.empty(200_000).uniform_(-20, 16, generator=g)) * torch.rand(200_000, generator=g)
    v = torch.cat([mags, mids, rnd.clamp(max=ladder.max_value)])
    v = torch.cat([v, -v])
    want = v.to(dtype)
    assert torch.equal(ladder_codes(v, ladder), want.view(torch.uint8))
    assert torch.equal(round_to_ladder(v, ladder), want.to(torch.float32))


@pytest.mark.parametrize("name", sorted(LADDERS))
def test_codes_roundtrip(name):
    ladder = LADDERS[name]
    mags = torch.tensor(ladder.magnitudes)
    vals = torch.cat([mags, -mags])
    codes = ladder_codes(vals, ladder)
    assert torch.equal(decode_codes(codes, ladder), vals)
    assert codes[: len(mags)].tolist() == list(range(len(mags)))  # code == index of the magnitude
    assert ladder.encode_magnitude(ladder.max_value) == len(mags) - 1


@pytest.mark.parametrize("name", sorted(LADDERS))
def test_saturates_any_magnitude(name):
    ladder = LADDERS[name]
    big = torch.tensor([ladder.max_value * 1.2, 3e38, float("inf")])
    assert (round_to_ladder(big, ladder) == ladder.max_value).all()
