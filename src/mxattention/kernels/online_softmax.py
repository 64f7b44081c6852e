"""The steps of the online softmax that both attention forwards take, written once.

Exposes the constants `LOG2E` (the kernels keep scores in log2 units: they take scale * LOG2E) and
`LN2` (lse back to natural log), and two `triton.jit` device functions, in the names of
docs/design.md, 'Attention algorithm':

- `p_tile`: one key tile's block maxima, new row max m, alpha, P~ and Q(P~) from its scores;
- `finish_o`, `finish_lse`: O = O~ / l (saturated to the output dtype) and lse (two functions, so
  that each kernel keeps its order of stores: the `tl` kernel stores O before it computes lse).

The `tl` forward (`attention_fwd._attend_tile` and its epilogue) and the Gluon Hopper forward
(`attention_fwd_hopper._softmax`, `_consumer`) call the same functions, which is what keeps the two
kernels bit for bit equal in these steps. Both use only layout-free operations (reshape, reductions,
elementwise), so a Gluon function can call them: Triton compiles a `triton.jit` function called from
a `gluon.jit` one with Gluon's semantics, the results in the layouts of its arguments (the reshape
of the Hopper kernel's m64n128 accumulator gives the `tl` kernel's reduction layouts,
benchmarks/NOTES.md v12a).
"""

from __future__ import annotations

import math

from mxattention.kernels._triton import tl, triton
from mxattention.kernels.cast import block_scale, elem_round, exp2_ftz

LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)
# The same two numbers as device constants (a kernel reads only constexpr globals).
LOG2E_C: tl.constexpr = tl.constexpr(LOG2E)
LN2_C: tl.constexpr = tl.constexpr(LN2)


@triton.jit
def p_tile(s, m, c, CAST):
    """(m_new, alpha, p3 = P~, p_hat3 = Q(P~), two_e) after one key tile: scores s [R, BN] (log2
    units before the factor c > 0; masked keys -inf), running max m [R]; p3 and p_hat3 [R, BN / 32,
    32] (blocks of 32 keys), two_e [R, BN / 32] the blocks' scales 2**e. CAST = (PNQ, CEIL, Q_EXP,
    Q_MANT, P_ELEM, P_CVT, EXP_FLUSH) (constexprs: P~'s ladder and rule; EXP_FLUSH: `cast.exp2_ftz`'s
    explicit flush, for the interpreter)."""
    CEIL: tl.constexpr = CAST[1]
    Q_EXP: tl.constexpr = CAST[2]
    Q_MANT: tl.constexpr = CAST[3]
    P_ELEM: tl.constexpr = CAST[4]
    P_CVT: tl.constexpr = CAST[5]
    EXP_FLUSH: tl.constexpr = CAST[6]
    R: tl.constexpr = s.shape[0]
    BN: tl.constexpr = s.shape[1]
    # Block maxima come from the scores (the product by c > 0, s - m and exp2 are monotone), and
    # the row max is the max of the block maxima. The block maxima of p_tilde, which set the
    # scales, and the elements take the reference's two roundings (s * c, then - m), so the max
    # gets exactly 1 and each block's largest element equals the maximum its scale was chosen
    # for. One fma per element (one instruction less) leaves the max exp2 of the rounding error
    # of s * c instead: an ulp of it is >= 1 from |s * c| >= 2**24 on, which emptied rows at
    # scores of 1.7e8 and made exp2 overflow at 3.6e10 (docs/design.md, 'Special values and
    # overflow').
    s3 = tl.reshape(s, [R, BN // 32, 32])
    s_blk = tl.max(s3, 2)
    m_new = tl.maximum(m, tl.max(s_blk, 1) * c)
    # A row with every key so far masked keeps m = -inf; exp2(-inf - 0) = 0 keeps it empty.
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    # exp2 results below 2**-126 are 0 on every target, as in the reference (`cast.exp2_ftz`).
    alpha = exp2_ftz(m - m_use, EXP_FLUSH)
    p3 = exp2_ftz(s3 * c - m_use[:, None, None], EXP_FLUSH)
    p_blk = exp2_ftz(s_blk * c - m_use[:, None], EXP_FLUSH)
    two_e = block_scale(p_blk, CEIL, Q_EXP, Q_MANT)
    p_hat3 = elem_round(p3, two_e[:, :, None], P_ELEM, P_CVT)
    return m_new, alpha, p3, p_hat3, two_e


@triton.jit
def finish_o(o_tilde, l, OUT_MAX: tl.constexpr):
    """O = O~ / l of rows with sum l [R], O~ [R, DV]; an empty row (l = 0) gets 0. OUT_MAX > 0: O
    saturated to +-OUT_MAX, NaN kept, as `attention.reference.cast_output` (the exact O is in
    range)."""
    empty = l == 0.0
    out = o_tilde / tl.where(empty, 1.0, l)[:, None]
    out = tl.where(empty[:, None], 0.0, out)
    if OUT_MAX > 0:
        out = tl.minimum(
            tl.maximum(out, -OUT_MAX, propagate_nan=tl.PropagateNan.ALL),
            OUT_MAX,
            propagate_nan=tl.PropagateNan.ALL,
        )
    return out


@triton.jit
def finish_lse(l, m):
    """lse = m + log l in natural log of rows with running max m [R] (log2 units) and sum l [R];
    -inf for an empty row (l = 0)."""
    empty = l == 0.0
    return tl.where(empty, float("-inf"), (m + tl.math.log2(tl.where(empty, 1.0, l))) * LN2_C)
