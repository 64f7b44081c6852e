"""An independent, deliberately plain MX cast in numpy float64, for checking the library's.

It shares nothing with `mxattention.formats` but the ladder's list of magnitudes: the exponent is
found by scanning integers e for the first with M <= q * 2**e (or from math.frexp for the floor
rule), and elements by nearest-magnitude search with an explicit even-index tie break.
"""

from __future__ import annotations

import math

import numpy as np

from mxattention.formats.ladders import ElementLadder

_ES = np.arange(-400, 400)


def ref_exponents(amax: np.ndarray, mode: str, q: float | None, ladder: ElementLadder) -> np.ndarray:
    """Unbiased exponents (int64) per block max; zero -> 0; clamped to [-127, 127]."""
    out = np.zeros(amax.shape, dtype=np.int64)
    for i, m in np.ndenumerate(amax):
        if m == 0 or not math.isfinite(m):
            continue
        if mode == "floor":
            e = math.frexp(float(m))[1] - 1 - math.floor(math.log2(ladder.max_value))
        else:
            e = int(_ES[np.argmax(float(m) <= q * np.exp2(_ES.astype(np.float64)))])
        out[i] = min(max(e, -127), 127)
    return out


def ref_round(v: np.ndarray, ladder: ElementLadder) -> np.ndarray:
    """Magnitude codes (int64) of |v|: nearest ladder magnitude, ties to the even index."""
    mags = np.asarray(ladder.magnitudes, dtype=np.float64)
    a = np.abs(v.astype(np.float64))[..., None]
    d = np.abs(a - mags)
    best = d.min(axis=-1, keepdims=True)
    hits = d == best
    # Among (at most two) tied neighbours prefer the even index.
    idx = np.arange(len(mags))
    even_hit = hits & (idx % 2 == 0)
    return np.where(even_hit.any(-1), np.argmax(even_hit, -1), np.argmax(hits, -1))


def ref_fake_quantize(
    x: np.ndarray,
    mode: str,
    q: float | None,
    ladder: ElementLadder,
    block: int = 32,
    min_exp: int | None = None,
):
    """(dequantized values, exponents) for a float array x of shape (n_blocks, block); with `min_exp`
    every block's exponent at least that."""
    x = x.astype(np.float64)
    amax = np.abs(x).max(axis=-1)
    e = ref_exponents(amax, mode, q, ladder)
    if min_exp is not None:
        e = np.maximum(e, min_exp)
    scaled = x / np.exp2(e.astype(np.float64))[:, None]
    codes = ref_round(scaled, ladder)
    mags = np.asarray(ladder.magnitudes)[codes]
    return np.copysign(mags, x) * np.exp2(e.astype(np.float64))[:, None], e
