"""The normalized Hadamard rotation of tile rows in registers (the device twin of `rotation.rotate`).

`hadamard_rows` computes the same fp32 butterflies in the same order as `rotation.fwht`, then one
multiply by 1/sqrt(b), so its values are bit-identical to the reference's.
"""

from __future__ import annotations

from mxattention.kernels._triton import tl, triton


@triton.jit
def hadamard_rows(x, BL: tl.constexpr, DP: tl.constexpr, ROT_LEVELS: tl.constexpr, ROT_NORM: tl.constexpr):
    """Rotate each row of fp32 x [BL, DP] in blocks of 2**ROT_LEVELS columns, times ROT_NORM.

    ROT_NORM = 1.0 leaves the scaling to the caller (`cast.cast_packed` folds it into its block scale).
    """
    # Level i pairs columns (j, j + 2**i) inside blocks of 2**(i+1), as rotation.fwht.
    for i in tl.static_range(ROT_LEVELS):
        x = tl.permute(tl.reshape(x, [BL, DP // (2 << i), 2, 1 << i]), 0, 1, 3, 2)
        lo, hi = tl.split(x)
        x = tl.reshape(tl.permute(tl.join(lo + hi, lo - hi), 0, 1, 3, 2), [BL, DP])
    if ROT_NORM != 1.0:
        x = x * ROT_NORM
    return x
