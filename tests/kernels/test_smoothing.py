"""Q smoothing on the kernels (kernels/smoothing.py, the block means, the head-chunk bound): the
correction's products are exact, its sums are fp32 sums, the means take no fp32 copy of Q, the
chunks keep enough programs per launch, and the kernel computes the reference's function on fp32,
fp16 and bf16 inputs (docs/design.md, 'Precision ladder and smoothing')."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mxattention.attention.config import get_method
from mxattention.attention.operands import q_block_mean_rows, q_block_means
from mxattention.attention.reference import reference_attention
from mxattention.kernels.fused import smoothing_heads_per_chunk
from mxattention.kernels.smoothing import CorrTiles, corr_tiles, smoothing_correction

from .helpers import compare, qkv
from .test_attention_kernel import _check


def _bits(g: torch.Generator, shape, bits: int, spread: int = 6) -> torch.Tensor:
    """fp32 values with exactly `bits` significant bits (the lowest one set) and exponents in
    [-spread, spread], random signs."""
    mant = torch.randint(0, 2 ** (bits - 2), shape, generator=g) * 2 + 1 + 2 ** (bits - 1)
    exp = torch.randint(-spread, spread + 1, shape, generator=g)
    sign = torch.randint(0, 2, shape, generator=g) * 2 - 1
    return (sign * mant).double().mul(torch.pow(2.0, (exp - bits + 1).double())).float()


@pytest.mark.parametrize(
    "dtype,q_bits,k_bits",
    # Bits so that qm needs all three bf16 parts (18), two (12) or one (4), and the key one (bf16,
    # or 4 bits), two (fp16, 10 bits) or three (fp32, 18 bits); products of <= 22 bits.
    [
        (torch.bfloat16, 18, 4),
        (torch.float16, 12, 10),
        (torch.float32, 4, 18),
        (torch.float32, 18, 4),
        (torch.float32, 12, 10),
    ],
)
def test_correction_products_are_exact(dtype, q_bits, k_bits, device):
    """One-hot keys make each correction value a single product qm_i,c * k_c, exact in fp32 when the
    factors' bits sum to <= 24 (so is every partial sum of its parts' products, at <= 22): then it
    must come out bit for bit. Dropping a bf16 part of qm or of the key changes these values."""
    g = torch.Generator().manual_seed(0)
    d, nb, lk = 64, 5, 100
    qm = _bits(g, (1, 2, nb, d), q_bits)
    vals = _bits(g, (lk,), k_bits, spread=3)
    k = torch.zeros(1, 1, lk, d)
    k[0, 0, torch.arange(lk), torch.arange(lk) % d] = vals
    assert torch.equal(k.to(dtype).float(), k)  # the keys are exact in `dtype`
    corr = smoothing_correction(qm.to(device), k.to(dtype).to(device), 128).cpu()
    want = (qm.double() @ k.double().transpose(-1, -2)).float()  # each one product, exact
    assert torch.equal(corr[..., :lk], want)
    assert (corr[..., lk:] == 0).all()  # padded keys


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_correction_is_an_fp32_dot(dtype, device):
    """Random qm (an offset, channel outliers) and keys, GQA (query head h reads KV head h // 2),
    a ragged key count: within a few fp32 roundings of the exact dot (|error| <= 2**-20 of sum |qm_c
    k_c|; the reference's own fp32 matmul is held to the same), zero past Lk."""
    g = torch.Generator().manual_seed(1)
    d, nb, lk = 96, 3, 150
    qm = (torch.randn(2, 4, nb, d, generator=g) + 2.0) * torch.exp(2 * torch.randn(d, generator=g))
    k = (torch.randn(2, 2, lk, d, generator=g) * torch.exp(torch.randn(d, generator=g))).to(dtype)
    corr = smoothing_correction(qm.to(device), k.to(device), 256).cpu()
    kr = k.float().repeat_interleave(2, 1).transpose(-1, -2)
    exact = qm.double() @ kr.double()
    bound = 2.0**-20 * (qm.double().abs() @ kr.double().abs())
    assert ((corr[..., :lk].double() - exact).abs() <= bound).all()
    assert ((qm @ kr).double() - exact).abs().le(bound).all()  # the reference's fp32 dot
    assert (corr[..., lk:] == 0).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_correction_bits_do_not_depend_on_the_launch(dtype, device):
    """Random qm and keys (sums that round), 2 batches x 4 query heads on 2 KV heads, 70 query
    blocks (ragged tiles: the fewest that make two), 100 keys (two key tiles, the last ragged):
    every batch / head chunk (`fused` splits by memory) and any key tiles per program, warps and
    stages give the whole default call's bits; on CUDA any tile shape too (each value the same k16
    MMA steps; the interpreter's numpy dot sums in an order that depends on the matrix shape, so
    there the default tile shape, a function of nb only)."""
    g = torch.Generator().manual_seed(4)
    d, nb, lk, lkp = 128, 70, 100, 128
    qm = ((torch.randn(2, 4, nb, d, generator=g) + 2.0) * torch.exp(torch.randn(d, generator=g))).to(device)
    k = (torch.randn(2, 2, lk, d, generator=g) * torch.exp(torch.randn(d, generator=g))).to(dtype).to(device)
    whole = smoothing_correction(qm, k, lkp)
    for bs, kv in ((slice(0, 1), slice(0, 2)), (slice(1, 2), slice(1, 2)), (slice(0, 2), slice(0, 1))):
        qh = slice(kv.start * 2, kv.stop * 2)
        assert torch.equal(smoothing_correction(qm[bs, qh], k[bs, kv], lkp), whole[bs, qh]), (bs, kv)
    t = corr_tiles(nb)
    shapes = [(t.blocks, t.keys)]
    if device == "cuda":
        shapes += [(64, 64), (128, 64)] + ([(64, 128), (128, 128)] if dtype == torch.bfloat16 else [])
    for blocks, keys in shapes:
        for kt, warps, stages in ((1, 4, 3), (3, 8, 2), (4, 4, 2)):
            tiles = CorrTiles(blocks, keys, kt, warps, stages)
            assert torch.equal(smoothing_correction(qm, k, lkp, tiles=tiles), whole), tiles


def test_block_means_take_any_float_dtype():
    """The means of a bf16 / fp16 query are those of its fp32 copy, bit for bit (each element widens
    exactly; the copy is never made), ragged last block, and none for no queries."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 3, 300, 40, generator=g) * 30 + 2
    for dtype in (torch.bfloat16, torch.float16):
        x = q.to(dtype)
        assert torch.equal(q_block_mean_rows(x, 128), q_block_mean_rows(x.float(), 128))
    m = q_block_mean_rows(q, 128)
    assert m.shape == (2, 3, 3, 40) and m.dtype == torch.float32
    torch.testing.assert_close(m[..., 2, :], q[..., 256:, :].mean(-2), rtol=1e-6, atol=1e-5)
    assert q_block_mean_rows(q[..., :0, :], 128).shape == (2, 3, 0, 40)
    assert q_block_mean_rows(q[..., :128, :], 128).shape == (2, 3, 1, 40)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA memory statistics")
def test_block_means_take_no_copy_of_the_query():
    """On CUDA the means of a bf16 query allocate their output and a partial sum, not 4 bytes per
    element of Q (the fp32 copy took 2 x 4 bytes per element: 2.6 GiB at Wan 75k)."""
    q = torch.randn(1, 8, 8192, 128, device="cuda").bfloat16()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    q_block_mean_rows(q, 128)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - base
    assert extra <= 4 * q.numel() // 16, extra  # the output is 4 / 128 bytes per element


def test_chunk_bound_keeps_programs_per_launch():
    """The correction obeys the K/V chunk bound (max(256 MiB, the packed K/V bytes)): at Wan 75k
    (40 heads, 591 query blocks) that is 2 heads per launch, 1182 programs (9 waves of 132 SMs,
    99.5 % full; 1 head was 4.5 waves), at 16k 20 (as K^ / V^'s chunks), and a given bound holds when above one head."""
    lkp, dp = 75648, 128
    assert smoothing_heads_per_chunk(1, 40, 1, 591, lkp, dp, dp) == 2
    assert smoothing_heads_per_chunk(1, 40, 1, 128, 16384, dp, dp) == 20  # 2 x 20, as K^ / V^
    for bound in (2**20, 2**24, 2**28):
        step = smoothing_heads_per_chunk(2, 8, 3, 40, 5120, 64, 64, bound)
        assert step == 1 or 4 * 2 * 3 * 40 * 5120 * step <= bound
    assert smoothing_heads_per_chunk(1, 40, 1, 591, lkp, dp, dp, None) == 40


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_kernel_matches_reference_on_each_input_dtype(dtype, device):
    """mxattention-pv8-smooth against the reference: Q = N(0, 1) * channel outliers + 2, keys with
    an offset, GQA, 200 queries (a ragged second block), 150 keys, in each input dtype."""
    q, k, v = qkv(1, 4, 2, 200, 150, 64, seed=30)
    q, k, v = (q + 2.0).to(dtype), k.to(dtype), v.to(dtype)
    c = compare(q, k, v, get_method("mxattention-pv8-smooth"), device=device)
    _check(c, f"smooth {dtype}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("elem", ["e2m1", "e4m3"])
def test_q_prepass_subtracts_the_block_means(dtype, elem, device):
    """The Q^ pass with q_mean: bit for bit mx_quantize(rotate(q - qm)) (each row its block's qm,
    300 rows: a ragged third block), padding rows zero codes with scale byte 127."""
    from mxattention.formats.mx import mx_quantize
    from mxattention.kernels.prepass import prepass_qk
    from mxattention.rotation import rotate

    g = torch.Generator().manual_seed(3)
    q = ((torch.randn(1, 2, 300, 64, generator=g) + 2) * torch.exp(torch.randn(64, generator=g))).to(dtype)
    qm = q_block_mean_rows(q, 128)
    codes, scales = prepass_qk(q.to(device), "uos", hadamard=True, elem=elem, q_mean=(qm.to(device), 128))
    per_row = q_block_means(q, 128)
    ref = mx_quantize(rotate(q.float() - per_row), axis=-1, rule="uos", elem=elem)
    assert torch.equal(codes[..., :300, :].cpu(), ref.data)
    assert torch.equal(scales[..., :300, :].cpu(), ref.scales)
    assert (codes[..., 300:, :] == 0).all() and (scales[..., 300:, :] == 127).all()


def test_block_beyond_the_queries_is_planned_as_one_tile_block(device):
    """A smoothing block B >= Lq is one block of all the queries: the plan takes the padded query
    length instead (one compiled kernel for every such B, no constexpr past int32), and the kernels
    give the bits of B = 128 for 100 queries (one block either way), lse included."""
    from mxattention.kernels import plan as plan_module
    from mxattention.kernels.fused import fused_attention

    q, k, v = (x.to(device) for x in qkv(1, 1, 1, 100, 40, 32, seed=31))
    smooth = get_method("mxattention-pv8-smooth")
    want = fused_attention(q, k, v, smooth, scale=0.2)
    huge = dataclasses.replace(smooth, smooth_q_block=2**40)
    assert plan_module.plan_call(huge, q, k, v, scale=0.2).smooth_q_block == 128
    got = fused_attention(q, k, v, huge, scale=0.2)
    assert torch.equal(got.out, want.out) and torch.equal(got.lse, want.lse)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_query_stays_in_its_row(bad, device):
    """A NaN / Inf in Q under Q smoothing: the kernels give NaN in its row only, O and lse, where
    the reference does (the block mean of that channel is taken as 0, `q_block_mean_rows`), and
    the reference's values on every other row (140 queries: two blocks, the bad one first)."""
    from mxattention.kernels.fused import fused_attention

    q, k, v = qkv(1, 2, 1, 140, 40, 32, seed=32)
    q = q + 2.0
    q[0, 1, 5, 3] = bad
    cfg = get_method("mxattention-pv8-smooth")
    out, lse = (
        x.cpu() for x in fused_attention(q.to(device), k.to(device), v.to(device), cfg, scale=0.2)[:2]
    )
    ref, ref_lse = reference_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), cfg, scale=0.2
    )
    row = torch.zeros_like(out, dtype=torch.bool)
    row[0, 1, 5] = True
    assert torch.equal(out.isnan(), row) and torch.equal(ref.isnan(), row)
    assert torch.equal(lse.isnan(), row[..., 0]) and torch.equal(ref_lse.isnan(), row[..., 0])
    ok = ~row
    assert (out[ok] - ref[ok]).norm() <= 1e-5 * ref[ok].norm()
