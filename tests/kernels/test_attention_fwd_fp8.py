"""The fast mode's kernel (`kernels.attention_fwd_fp8`) against its emulation (`attention.fast` in the
reference), docs/fast_mode.md. On Triton's interpreter the FP8 dots are exact fp32 dots, so kernel
and emulation differ only as the exact kernel and the reference do (fp32 summation order, exp2 vs
exp): the bounds of test_attention_kernel.py. On the H200 the FP8 wgmma accumulates with fewer bits
(benchmarks/check_fp8_gpu.py measures it)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mxattention.attention.config import get_method
from mxattention.attention.reference import reference_attention
from mxattention.formats.fold import fold
from mxattention.formats.mx import fake_quantize
from mxattention.kernels._triton import tl, triton
from mxattention.kernels.attention_fwd_fp8 import fold_pass, fp8_p_tile, key_slots
from mxattention.kernels.plan import plan_call

from .helpers import compare, qkv

FAST = get_method("mxattention-fast")


def _check(c):
    assert torch.isfinite(c.out).all()
    assert c.rel_l2 <= 1e-3 * c.quant_rel_l2, (c.rel_l2, c.quant_rel_l2)
    assert c.p_differ <= 1e-3 * c.p_decisions
    # (plus fp32 ulps of large lse: keys scaled by up to 2**9 give scores ~2e3)
    big = c.ref_lse[torch.isfinite(c.ref_lse)].abs().max().item()
    assert c.lse_max_abs <= 1e-4 + 1e-6 * big + 0.6 * c.max_row_flips
    assert torch.equal(torch.isneginf(c.lse), torch.isneginf(c.ref_lse))


def test_kernel_matches_the_emulation_with_blocks_outside_the_fold(device):
    q, k, v = qkv(1, 2, 1, 45, 100, 64, seed=3)  # GQA, lengths not tile multiples
    g = torch.Generator().manual_seed(4)
    k = k * torch.exp2(torch.randint(-9, 10, (1, 1, 100, 1), generator=g).float())  # keys over 18 binades
    v[:, :, 32:64] *= 2.0**-20  # a V block 20 binades under its columns' tops
    c = compare(q, k, v, FAST, device=device)
    _check(c)
    # The kernel follows the fold, not the exact method: here the two differ.
    kr, vr = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    exact, _ = reference_attention(q, kr, vr, get_method("mxattention"), scale=64**-0.5)
    gap = ((c.ref_out.cpu() - exact).norm() / exact.norm()).item()
    assert gap > 0 and c.rel_l2 <= 1e-3 * gap, (c.rel_l2, gap)


@pytest.mark.parametrize("masking", ["causal+bool", "additive"])
def test_kernel_matches_the_emulation_masked(masking, device):
    q, k, v = qkv(1, 1, 1, 40, 70, 32, seed=5)
    g = torch.Generator().manual_seed(6)
    if masking == "additive":
        mask = torch.randn(1, 1, 40, 70, generator=g)
        _check(compare(q, k, v, FAST.with_tiles(block_n=32), mask=mask, device=device))
    else:
        mask = torch.rand(1, 1, 40, 70, generator=g) > 0.3
        _check(compare(q, k, v, FAST, mask=mask, is_causal=True, device=device))


def _mx_bf16(shape, axis, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g)
    x = x * torch.exp2(torch.randint(-12, 13, (*shape[:-2], shape[-2], 1), generator=g).float())
    return fake_quantize(x, axis).to(torch.bfloat16)  # MX values are exact in bf16


@pytest.mark.parametrize(
    "anchors,dims,axis", [("row", (-1,), -1), ("head", (-2, -1), -1), ("column", (-2,), -2)]
)
def test_fold_pass_bytes_equal_formats_fold(anchors, dims, axis, device):
    x = _mx_bf16((1, 2, 64, 32), axis, seed=7)
    x[0, 0, 5] = 0.0  # a zero row
    x[0, 1, 3, 7] = float("nan")
    x[0, 1, 10:] = 0.0  # zero rows: they must not lift the head's anchor
    x[0, 1, :10] *= 2.0**-30
    f8, a = fold_pass(x.to(device).contiguous(), anchors)
    f, ra = fold(x.float(), dims)
    got = f8.float().cpu()
    if anchors == "column":  # V^ transposed, keys in key_slot order within blocks of 32
        got = got[..., key_slots(torch.arange(got.shape[-1]))].transpose(-1, -2)
    assert torch.equal(a.cpu(), ra.reshape(a.shape))
    assert torch.equal(torch.nan_to_num(got, nan=1e9), torch.nan_to_num(f, nan=1e9))


def test_key_slots_permute_each_block_of_32_as_the_fp8_a_operand_holds_p():
    """Accumulator column 16 i1 + 8 i0 + 2 t + e of a 32-key block sits at 16 i1 + 4 t + 2 i0 + e."""
    n = torch.arange(256)
    slots = key_slots(n)
    assert torch.equal(torch.sort(slots).values, n) and torch.equal(slots // 32, n // 32)
    i1, i0, t, e = (n % 32) // 16, (n % 32) // 8 % 2, (n % 32) // 2 % 4, n % 2
    assert torch.equal(slots % 32, 16 * i1 + 4 * t + 2 * i0 + e)


def test_plan_names_the_fast_kernel_and_refuses_what_it_does_not_serve():
    q, k, v = qkv(1, 2, 2, 20, 30, 64)
    plan = plan_call(FAST, q, k, v, scale=0.125)
    assert plan.mma == "fp8" and "fp8 kernel" in plan.describe()
    assert plan_call(get_method("mxattention"), q, k, v, scale=0.125).mma == "exact"
    smooth = dataclasses.replace(FAST, smooth_q=True, name="fast-smooth")
    assert "does not smooth Q" in plan_call(smooth, q, k, v, scale=0.125).refusal
    cu = torch.tensor([0, 20], dtype=torch.int32)
    packed = [x[0].transpose(0, 1) for x in (q, k, v)]
    assert "dense calls" in plan_call(FAST, *packed, scale=0.125, varlen=(cu, cu, 20, 20)).refusal


def test_kernel_saturates_p_under_a_floor_rule(device):
    """Under OCP's floor rule a block's elements reach 8 x 2**e before the cast, which saturates them
    at 6 x 2**e; the kernels skip that min only for ceil rules with boundary < 7 (`fp8_p_tile`)."""
    ocp = dataclasses.replace(get_method("mxfp4-ocp-hadamard-pnq"), name="ocp-fast", mma="fp8")
    q, k, v = qkv(1, 1, 1, 40, 96, 32, seed=9)
    c = compare(q * 4, k * 4, v, ocp, device=device)  # wide score spreads: many P~ blocks saturate
    _check(c)
    assert c.p_differ == 0


def test_kernel_keeps_rows_finite_where_the_score_factor_underflows(device):
    """Q and K of tiny magnitude: the row's factor scale log2(e) 2**(a_q + a_k) is below fp32's range
    (the scores are 0 in fp32, the reference's softmax uniform); masked keys (past Lk) must stay
    -inf, not -inf x 0 = NaN."""
    q, k, v = qkv(1, 1, 1, 40, 70, 32, seed=11)
    c = compare(q * 1e-30, k * 1e-20, v, FAST, device=device)
    assert torch.isfinite(c.out).all() and torch.isfinite(c.lse).all()
    _check(c)


def test_kernel_rows_with_huge_scores_keep_the_emulations_result(device):
    """Scores of ~1e9 (log2 units): the running max minus 8 is not exact there, so those rows fold P~
    without the factor 2**8 (`fp8_shift`); O, l and lse stay the emulation's."""
    q, k, v = qkv(1, 1, 1, 40, 70, 32, seed=13, outliers=False)
    c = compare(q * 3e4, k * 3e4, v, FAST, device=device)
    big = c.ref_lse[torch.isfinite(c.ref_lse)].abs()
    assert big.max().item() > 2.0**28 and (big > 2.0**27).float().mean().item() > 0.5
    assert torch.isfinite(c.out).all()
    _check(c)


@triton.jit
def _p_tile_probe(S, M, C, P3, R3, BN: tl.constexpr, CEIL: tl.constexpr, Q_EXP: tl.constexpr,
                  Q_MANT: tl.constexpr):  # fmt: skip
    rows = tl.arange(0, 16)
    offs = rows[:, None] * BN + tl.arange(0, BN)[None, :]
    _m, _a, p3, r3 = fp8_p_tile(
        tl.load(S + offs), tl.load(M + rows), tl.load(C + rows), CEIL, Q_EXP, Q_MANT, False
    )
    tl.store(P3 + offs, tl.reshape(p3, [16, BN]))
    tl.store(R3 + offs, tl.reshape(r3, [16, BN]))


def test_p_tile_rounds_p_as_the_reference_with_the_block_scale_floor(device):
    """`fp8_p_tile`'s P^ 2**8 (r3) is `fake_quantize(P~, min_exp=P_MIN_EXP)` 2**8 of its own P~ 2**8
    (p3), bit for bit, on rows whose blocks span 40 binades (many of them under 2**-16 of the row's
    largest, where the floor decides), and each value is an E4M3 value (the bytes hold r3 exactly, so
    PNQ's l sums what P~ V^ reads). Mutant: the floor dropped -> differs (blocks under the floor keep
    their own finer scale, and r3 leaves E4M3's grid)."""
    from mxattention.formats.fold import P_MIN_EXP
    from mxattention.kernels.rules import rule_constants

    g = torch.Generator().manual_seed(11)
    bn = 128
    # scores (log2, c = 1): each 32-key block 0 to 40 binades under the row's top (0, in block 0),
    # its keys spread over 6 binades below the block's own top
    tops = torch.rand(16, bn // 32, generator=g) * -40.0
    tops[:, 0] = 0.0
    s = tops.repeat_interleave(32, 1) - torch.rand(16, bn, generator=g) * 6.0
    s[:, 0] = 0.0
    m = torch.zeros(16)
    c = torch.ones(16)
    p3, r3 = torch.empty(16, bn), torch.empty(16, bn)
    t = lambda x: x.to(device)  # noqa: E731
    pr = rule_constants(FAST.p.rule, FAST.p.elem)
    outs = [t(p3), t(r3)]
    _p_tile_probe[(1,)](t(s), t(m), t(c), *outs, BN=bn, CEIL=pr.ceil, Q_EXP=pr.q_exp, Q_MANT=pr.q_mant)
    p3, r3 = (x.cpu() for x in outs)
    want = fake_quantize(p3 / 256, -1, rule=FAST.p.rule, elem=FAST.p.elem, min_exp=P_MIN_EXP) * 256
    assert torch.equal(r3, want)
    assert torch.equal(r3.to(torch.float8_e4m3fn).float(), r3)
    floor_decides = fake_quantize(p3 / 256, -1, rule=FAST.p.rule, elem=FAST.p.elem) * 256 != want
    assert floor_decides.sum() > 100  # the case is one the floor decides
