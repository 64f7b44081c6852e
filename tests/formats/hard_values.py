"""Adversarial float32 inputs for the casts: ties, powers of two, boundaries, tiny and huge magnitudes."""

from __future__ import annotations

import torch

from mxattention.formats.ladders import ElementLadder


def _up(x: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(x, torch.full_like(x, float("inf")))


def _down(x: torch.Tensor) -> torch.Tensor:
    return torch.nextafter(x, torch.full_like(x, -float("inf")))


def hard_values(
    ladder: ElementLadder, n: int, *, seed: int, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """`n` values (a multiple of 32) in `dtype`, arranged so that every block of 32 mixes a
    block maximum from an adversarial family with elements on ties, ladder points and randoms.

    Families of block maxima: exact powers of two at every binade, q * 2**k and its float
    neighbours for q in {6, 7, 7.25, 8}, magnitudes near 2**+-126, subnormals, zero blocks.
    Elements: midpoints of the ladder (ties) and ladder points times the block's scale at every
    binade, +-0, random normals.
    """
    assert n % 32 == 0
    g = torch.Generator().manual_seed(seed)
    finfo = torch.finfo(dtype)
    lo_exp = int(torch.log2(torch.tensor(finfo.tiny)).item()) - (23 if dtype == torch.float32 else 10)
    hi_exp = int(torch.log2(torch.tensor(finfo.max)).item())
    nb = n // 32
    k = torch.randint(lo_exp + 4, hi_exp - 3, (nb,), generator=g).to(torch.float32)
    q = torch.tensor([6.0, 7.0, 7.25, 8.0, 1.0, 1.5, ladder.max_value, ladder.uos_boundary])
    qi = q[torch.randint(0, len(q), (nb,), generator=g)]
    # Products past the dtype's range become its largest finite value (itself a hard case).
    bmax = (qi.double() * torch.exp2(k.double())).clamp(max=finfo.max).to(torch.float32)
    nudge = torch.randint(0, 3, (nb,), generator=g)
    bmax = torch.where(nudge == 1, _up(bmax), torch.where(nudge == 2, _down(bmax), bmax))
    bmax = bmax.clamp(max=finfo.max)
    # Elements relative to the block's power-of-two scale: ladder points and midpoints (ties).
    mags = torch.tensor(ladder.magnitudes, dtype=torch.float32)
    mids = (mags[1:] + mags[:-1]) / 2
    pts = torch.cat([mags, mids])
    scale = torch.exp2(torch.floor(torch.log2(bmax)) - ladder.emax)
    choice = pts[torch.randint(0, len(pts), (nb, 32), generator=g)]
    rnd = torch.randn(nb, 32, generator=g) * 2.0
    kind = torch.randint(0, 3, (nb, 32), generator=g)
    elems = torch.where(kind == 0, choice, torch.where(kind == 1, choice * 0.5, rnd)) * scale[:, None]
    elems = elems.clamp(-bmax[:, None], bmax[:, None])
    sign = torch.where(torch.rand(nb, 32, generator=g) < 0.5, -1.0, 1.0)
    elems = elems * sign
    pos = torch.randint(0, 32, (nb,), generator=g)
    elems[torch.arange(nb), pos] = bmax * torch.where(torch.rand(nb, generator=g) < 0.5, -1.0, 1.0)
    # Special blocks: all zero (with -0), subnormal-only, near 2**-126 and near the dtype max.
    special = torch.randint(0, 12, (nb,), generator=g)
    elems[special == 0] = 0.0
    elems[special == 1] = -0.0
    sub = torch.randint(1, 64, (nb, 32), generator=g).to(torch.float32) * finfo.smallest_normal / 64
    elems = torch.where((special == 2)[:, None], sub, elems)
    near = torch.randn(nb, 32, generator=g) * 2.0**-126
    elems = torch.where((special == 3)[:, None], near, elems)
    return elems.reshape(-1).to(dtype)


def with_nonfinite(x: torch.Tensor, *, seed: int, frac: float = 0.01) -> torch.Tensor:
    """A copy of x with NaN, +Inf and -Inf sprinkled in at rate `frac` each."""
    g = torch.Generator().manual_seed(seed)
    y = x.clone()
    for v in (float("nan"), float("inf"), -float("inf")):
        m = torch.rand(x.shape, generator=g) < frac
        y[m] = v
    return y
