"""The fast mode's operands straight from Q, K, V (`attention_fwd_fp8.fp8_operands_from_inputs`: the
Q^ fold inside the pre-pass, K^ / V^ folded from packed MX bytes with the pre-pass's anchors) equal
the bf16 pre-pass followed by `fp8_operands` bit for bit: q8, rowscale, k8, v8t in both key orders,
colscale. On Triton's interpreter bf16 subnormals flush (tests/kernels/test_prepass.py), so the bf16
reference path is exact only for MX values >= 2**-126: the CPU inputs stay above; CUDA adds some.
"""

from __future__ import annotations

import math

import pytest
import torch

from mxattention.formats.fold import fold, fold_anchor
from mxattention.formats.ladders import E2M1
from mxattention.formats.mx import fake_quantize, pow2
from mxattention.formats.packing import unpack_uint4
from mxattention.formats.rounding import decode_codes
from mxattention.kernels import prepass, targets
from mxattention.kernels.attention_fwd_fp8 import fp8_operands, fp8_operands_from_inputs
from mxattention.kernels.fold8 import NO_ANCHOR
from mxattention.kernels.prepass import (
    prepass_k_anchored,
    prepass_q_fold8,
    prepass_qk,
    prepass_v,
    qk_pass,
    v_pass,
)

NAMES = ("q8", "rowscale", "k8", "v8t", "colscale")


def _bits(x: torch.Tensor) -> torch.Tensor:
    """The bit patterns, every fp32 NaN as the canonical one: a NaN's payload carries no meaning, and
    the H200's max() returns 0x7fffffff where the CPU keeps 0x7fc00000 (GPU run, 2026-12-04)."""
    if x.element_size() == 1:
        return x.cpu().view(torch.uint8)
    x = x.cpu()
    if x.is_floating_point():
        x = torch.where(x.isnan(), torch.full_like(x, math.nan), x)
    return x.view(torch.int32)


def _assert_same(old, new, label=""):
    for name, a, b in zip(NAMES, old, new, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, (label, name, a.shape, b.shape)
        bad = (_bits(a) != _bits(b)).nonzero()
        assert bad.numel() == 0, (label, name, bad[:5].tolist(), bad.shape[0])


def _old(q, k, v, rules, hadamard, scale, lm, ln, slots):
    """The reference path: the bf16 pre-pass, then `fp8_operands` (`fold_pass`)."""
    qb = prepass_qk(q, rules[0], hadamard=hadamard, len_multiple=lm, out_bf16=True)
    kb = prepass_qk(k, rules[1], hadamard=hadamard, len_multiple=ln, out_bf16=True)
    vb = prepass_v(v, rules[2], len_multiple=ln, out_bf16=True)
    return [fp8_operands(qb, kb, vb, scale, q.shape[1] // k.shape[1], slots=s) for s in slots]


def _new(q, k, v, rules, hadamard, scale, lm, ln, slots):
    kw = dict(hadamard=hadamard, scale=scale, q_len_multiple=lm, k_len_multiple=ln, slots=slots)
    return fp8_operands_from_inputs(q, k, v, rules, **kw)


def _nasty(b, hq, hk, lq, lk, d, dv, seed, device):
    """Q, K, V with per-row binades over +-24 (blocks outside the 14-binade fold, rounding and ties
    there), zero rows, a zero KV head, a zero V column, NaN / +-Inf, rows at 1e-30 and 1e30."""
    g = torch.Generator().manual_seed(seed)

    def rows(shape, spread):
        x = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape[-1], generator=g))
        return x * torch.exp2(torch.randint(-spread, spread + 1, (*shape[:-1], 1), generator=g).float())

    q, k, v = rows((b, hq, lq, d), 24), rows((b, hk, lk, d), 12), rows((b, hk, lk, dv), 4)
    # V blocks far under their columns' tops: some fold inexactly, onto E4M3's subnormals and ties.
    v[..., 32:64, :] *= 2.0**-15
    v[0, 0, 64:, 1] *= 2.0**-17
    q[0, 0, 3] = 0.0
    q[-1, -1, 5, :7] = 0.0
    q[0, 1 % hq, 7] *= 1e-30 / q[0, 1 % hq, 7].abs().max()
    q[0, 0, 8] *= 1e30 / q[0, 0, 8].abs().max()
    q[0, 0, 9, 4] = float("nan")
    q[0, -1, 10, 33 % d] = float("inf")
    k[0, 0, 11] *= 1e30 / k[0, 0, 11].abs().max()  # lifts head 0's anchor: Q rows 8 overflow rowscale
    k[0, 0, 12, 2] = -float("inf")
    k[0, 0, 13, 0] = float("nan")
    k[-1, -1] = 1e-33 * torch.randn(lk, d, generator=g)  # a tiny head: its Q rows' rowscale clamps
    v[0, 0, 14, 5] = float("nan")
    v[0, -1, :, 6] = 0.0  # a zero column
    v[0, -1, :, 7] = 1e-36 * torch.rand(lk, generator=g)  # column anchor -128: a subnormal colscale
    if b * hk > 2:
        k[-1, 0] = 0.0  # a zero head: anchor 0
        v[-1, 0] = 0.0
    if device == "cuda":  # MX values below 2**-126 (the interpreter's bf16 reference flushes them)
        q[0, -1, 15] *= 1e-38 / q[0, -1, 15].abs().max()
        v[0, 0, :, 9] *= 1e-40 / v[0, 0, :, 9].abs().max()
    return q.to(device), k.to(device), v.to(device)


@pytest.mark.parametrize(
    "heads,d,dv,hadamard,rules,lm,ln,slots",
    [
        ((2, 2, 2), 48, 40, False, ("ocp", "tfs", "uos"), 32, 32, (False,)),
        ((2, 2, 1), 64, 48, True, ("uos", "uos", "uos"), 64, 32, (True,)),
        ((1, 2, 2), 128, 128, True, ("uos", 5.3, "ocp"), 32, 64, (False, True)),
        ((1, 2, 2), 256, 32, True, ("uos", "uos", "uos"), 32, 32, (False,)),  # Q^ / K^ passes in tiles
    ],
)
def test_operands_from_inputs_equal_the_bf16_path(heads, d, dv, hadamard, rules, lm, ln, slots, device):
    """Batches x query heads x KV heads `heads` (GQA: group 2), lengths 45 / 70 padded to multiples
    of 32 or 64 (V^'s fold in programs of 32 and 64 keys); V^ in the `tl` kernel's key order, the
    Gluon kernel's, or both."""
    q, k, v = _nasty(*heads, 45, 70, d, dv, seed=d, device=device)
    old = _old(q, k, v, rules, hadamard, 0.125, lm, ln, slots)
    for order, ref in zip(slots, old, strict=True):
        _assert_same(ref, _new(q, k, v, rules, hadamard, 0.125, lm, ln, order), f"slots={order}")
    # Inputs of every kind reached the fold: NaN bytes, rows and columns of zeros, rowscale clamped
    # and overflowed, a subnormal colscale, inexact folds (V blocks 15 and more binades down).
    q8, rowscale, k8, v8t, colscale = old[0]
    assert _bits(q8).eq(0x7F).any() and _bits(k8).eq(0x7F).any() and _bits(v8t).eq(0x7F).any()
    assert (rowscale == 2.0**-126).any() and rowscale.isinf().any()
    assert (colscale[0, -1, 7] < 2.0**-126).item() and colscale[0, -1, 7] > 0
    assert fake_quantize(v.float().cpu(), -2, rule=rules[2])[0, 0, 32:64].ne(0).any()


@pytest.mark.parametrize(
    "scale", [0.125, 0.0, -0.5, math.inf, -math.inf, math.nan, 1e-45, 1e-40, 3e38, 1e300]
)
def test_rowscale_for_every_scale(scale, device):
    """rowscale = max(fp32(scale log2 e) 2**(a_q + a_k), 2**-126) for degenerate and subnormal
    score constants too (`prepass.score_scale_parts`), with anchor sums below 2**-149 and above 0."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 32, 32, generator=g) * torch.exp2(torch.linspace(-100, 100, 32))[:, None]
    k = torch.randn(1, 1, 32, 32, generator=g) * 2.0**-60  # anchor sums from -176 to 24
    v = torch.randn(1, 1, 32, 32, generator=g)
    q, k, v = q.to(device), k.to(device), v.to(device)
    rules = ("uos",) * 3
    qb = prepass_qk(q, "uos", hadamard=False, len_multiple=32, out_bf16=True)
    kb = prepass_qk(k, "uos", hadamard=False, len_multiple=32, out_bf16=True)
    vb = prepass_v(v, "uos", len_multiple=32, out_bf16=True)
    want = fp8_operands(qb, kb, vb, scale, 2, slots=False)[1]
    got = _new(q, k, v, rules, False, scale, 32, 32, False)[1]
    assert torch.equal(_bits(got), _bits(want)), (got, want)


@pytest.mark.parametrize("gap", [14, 15, 20])
def test_folds_of_blocks_far_under_their_anchor(gap, device):
    """`fold8.fold_rows` (Q^) and `fold8.fold_decoded` (K^, V^): a Q row, a K row and a V column whose
    second block lies `gap` binades under the first (no rotation, so the blocks keep their scales:
    2**0 and 2**-gap, the anchor -6). Up to 14 binades down every value folds onto E4M3 by one
    multiply; further down (r 2**(6 - gap) below E4M3's subnormal step for r = 0.5: ties, roundings
    onto subnormals, flushes to 0) the tile takes the rounding. Either way the bytes equal the bf16
    path's; the other tiles of each launch hold no such block. Negatives that round to 0 fold to +0."""
    g = torch.Generator().manual_seed(gap)
    q = torch.randn(1, 2, 45, 64, generator=g).clamp(-3.5, 3.5)
    k = torch.randn(1, 1, 70, 64, generator=g).clamp(-3.5, 3.5)
    v = torch.randn(1, 1, 70, 64, generator=g).clamp(-3.5, 3.5)
    for x in (q, k):  # every block's top: amax 4, scale 2**0 under UOS (r_max 4)
        x[..., 0] = x[..., 32] = 4.0
    v[..., 0, :] = v[..., 32, :] = 4.0  # (V's blocks run along the keys)
    q[0, 1, 5, 32:] *= 2.0**-gap
    q[0, 1, 6, 33:40] = torch.tensor([-0.01, 0.01, -3.0, 0.75, 0.25, 0.125, 1.25]) * 2.0**-gap
    k[0, 0, 5, 32:] *= 2.0**-gap
    v[0, 0, 32:64, 3] *= 2.0**-gap
    q, k, v = q.to(device), k.to(device), v.to(device)
    rules = ("uos",) * 3
    old = _old(q, k, v, rules, False, 0.125, 32, 32, (True,))[0]
    _assert_same(old, _new(q, k, v, rules, False, 0.125, 32, 32, True), f"gap={gap}")
    q8, k8, v8t = (_bits(old[i])[0] for i in (0, 2, 3))
    assert q8[1, 5, 0] == q8[0, 0, 0] == k8[0, 5, 0] == 0x78  # 4 folded with anchor -6: 256
    for far in (q8[1, 5, 32:], k8[0, 5, 32:], v8t[0, 3, 32:64]):
        # the values that did not fold by a multiply: E4M3 subnormals (gap 15) and zeros
        assert (far & 0x78).eq(0).all() == (gap > 14) and far.ne(0).any() == (gap < 20)


def test_q_fold_of_rows_with_subnormal_blocks(device):
    """Rows whose block maxima are fp32 subnormals: the block exponent clamps at -127, so a row's top
    can be 0.5 x 2**-127 and lie 9 binades over its anchor (k = e - a up to 9, not 6). The folded Q^
    pass equals `formats.fold` of the MX values (fp32 input: no bf16 flush on the interpreter)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1, 2, 40, 64, generator=g)
    x = x * torch.exp2(-torch.arange(118, 158, dtype=torch.float32))[:, None]  # rows 2**-118 .. 2**-157
    x[0, 1, 3, 32:] = 0.0
    want, want_a = fold(fake_quantize(x, -1, rule="uos"), (-1,))
    x = x.to(device)
    anchors = torch.zeros(2, dtype=torch.int32, device=device)
    q8, _ = prepass_q_fold8(x, "uos", hadamard=False, kv_anchors=anchors, scale=0.125, len_multiple=32)
    got = q8[..., :40, :].float().cpu()
    bad = (got != want).nonzero()
    assert bad.numel() == 0, (bad[:5].tolist(), got[tuple(bad[0])], want[tuple(bad[0])])
    assert (want_a < -135).any()  # tops of 0.5 x 2**-127 and below: anchors under the clamp


def _decode_packed(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """fp32 values of packed E2M1 codes with E8M0 bytes, blocks of 32 along the last axis (byte
    255: NaN), as `formats.mx.MXTensor.dequantize`."""
    vals = decode_codes(unpack_uint4(codes.cpu()), E2M1).unflatten(-1, (-1, 32))
    out = vals * pow2(scales.cpu().to(torch.int32) - 127).unsqueeze(-1)
    return torch.where((scales.cpu() == 255).unsqueeze(-1), float("nan"), out).flatten(-2)


def _same_values(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(torch.nan_to_num(a, nan=7e7), torch.nan_to_num(b, nan=7e7))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's butterflies overflow to Inf
@pytest.mark.parametrize("d,hadamard", [(64, True), (128, True), (32, False)])
def test_packed_passes_decode_to_the_bf16_values(d, hadamard, device):
    """The premise of the packed fold: the packed pre-pass (`cast_packed`, the rotation's 1/sqrt(b)
    in the block scale; on sm_90 the Gluon pass) and the anchored K^ pass decode to exactly the
    bf16 pass's values, on ragged lengths, zeros, NaN / Inf, huge and tiny rows; the anchored K^
    pass writes the packed pass's bytes; the anchors are `formats.fold`'s."""
    g = torch.Generator().manual_seed(d)
    x = torch.randn(1, 3, 70, d, generator=g)
    x = x * torch.exp2(torch.randint(-90, 91, (1, 3, 70, 1), generator=g).float())
    x[0, 0, :5] *= 1e-30  # rows around 2**-100 .. 2**-190: their tiny blocks fold in the packed path
    x[0, 0, 5] = 3e38  # near fp32's top: MX values that overflow to Inf
    x[0, 0, 6, :3] = torch.tensor([3.3e38, -2e38, 1.7e38])
    x[0, 1, 7] = 0.0
    x[0, 1, 8, 1] = float("nan")
    x[0, 1, 9, 30] = -float("inf")
    x[0, 2] = 0.0  # a zero head
    if device == "cpu":
        x = torch.where(x.abs() >= 1e-30, x, 0.0)  # (the interpreter's bf16 flush)
    x = x.to(device)
    bf = prepass_qk(x, "uos", hadamard=hadamard, len_multiple=32, out_bf16=True).float().cpu()
    codes, scales = prepass_qk(x, "uos", hadamard=hadamard, len_multiple=32)
    assert _same_values(_decode_packed(codes, scales), bf)
    anchors = torch.full((3,), NO_ANCHOR, dtype=torch.int32, device=device)
    kc, ks = prepass_k_anchored(x, "uos", hadamard=hadamard, anchors=anchors, len_multiple=32)
    assert torch.equal(kc, codes) and torch.equal(ks, scales)
    finite = torch.where(bf.isfinite(), bf.abs(), 0.0)
    want = fold_anchor(finite.amax(dim=(-2, -1)))[0]
    want = torch.where(finite.amax(dim=(-2, -1))[0] > 0, want, NO_ANCHOR)
    assert torch.equal(anchors.cpu(), want) and want[2] == NO_ANCHOR
    # V: keys along the blocks, keys last; a column's anchor over its keys.
    vbf = prepass_v(x, "ocp", len_multiple=32, out_bf16=True).float().cpu()
    av = torch.full((3 * max(32, d),), NO_ANCHOR, dtype=torch.int32, device=device)
    vc, vs = prepass_v(x, "ocp", len_multiple=32, anchors=av)
    assert _same_values(_decode_packed(vc, vs), vbf.transpose(-1, -2))
    vmax = torch.where(vbf.isfinite(), vbf.abs(), 0.0).amax(dim=-2)
    want_v = torch.where(vmax > 0, fold_anchor(vmax), NO_ANCHOR).flatten()
    assert torch.equal(av.cpu(), want_v)


def test_fast_mode_passes_are_planned_tl_and_refuse_other_plans(monkeypatch):
    """On sm_90 at D 128 the packed Q^ / K^ pass is Gluon's (`prepass_hopper`), which writes neither
    the folded Q^ nor the anchors: the fast mode's passes are planned as the `tl` kernel, and a plan
    made for another output is refused instead of run."""
    x = torch.randn(1, 2, 64, 128, dtype=torch.bfloat16)
    monkeypatch.setattr(prepass.prepass_hopper, "usable_q", lambda *a: True)
    monkeypatch.setattr(prepass.prepass_hopper, "usable", lambda *a: True)
    common = dict(hadamard=True, out_bf16=False, elem="e2m1", smoothed=False)
    assert qk_pass(x, 128, **common).kernel == "gluon"  # what the exact path takes
    fq, fk = qk_pass(x, 128, **common, fold="q"), qk_pass(x, 128, **common, fold="k")
    assert (fq.kernel, fq.out, fk.kernel, fk.out) == ("tl", "folded", "tl", "packed+anchor")
    # The folded Q^'s bytes by the hardware cast only where the plan's target has it checked.
    assert not fq.hw_cast and "hardware" not in str(fq)
    monkeypatch.setattr(prepass, "current_target", lambda device: targets.SM_90A)
    hq = qk_pass(x, 128, **common, fold="q")
    assert hq.hw_cast and "hardware E4M3 cast" in str(hq) and not qk_pass(x, 128, **common, fold="k").hw_cast
    monkeypatch.setattr(prepass, "current_target", lambda device: targets.GFX950)
    assert not qk_pass(x, 128, **common, fold="q").hw_cast
    with pytest.raises(ValueError, match="fold"):
        qk_pass(x, 128, **(common | dict(out_bf16=True)), fold="q")
    with pytest.raises(ValueError, match="pass_plan"):
        prepass_qk(x, "uos", hadamard=True, pass_plan=fq)
    anchors = torch.full((2,), NO_ANCHOR, dtype=torch.int32)
    with pytest.raises(ValueError, match="pass_plan"):  # a plan for the packed pass
        prepass_q_fold8(x, "uos", hadamard=True, kv_anchors=anchors, scale=0.1, pass_plan=fk)
    with pytest.raises(ValueError, match="kv_anchors"):
        prepass_q_fold8(x, "uos", hadamard=True, kv_anchors=anchors[:1].repeat(3), scale=0.1)
    with pytest.raises(ValueError, match="anchors"):
        prepass_k_anchored(x, "uos", hadamard=True, anchors=anchors[:1])
    va = v_pass(x, 128, out_bf16=False, elem="e2m1", anchors=True)
    assert (va.kernel, va.out) == ("tl", "packed+column anchors")
    with pytest.raises(ValueError, match="pass_plan"):
        prepass_v(x, "uos", pass_plan=va)
    with pytest.raises(ValueError, match="anchors"):
        prepass_v(x, "uos", out_bf16=True, anchors=torch.zeros(256, dtype=torch.int32))


def test_planned_passes_other_tiles_same_bytes(device):
    """`fp8_operands_from_inputs` runs the passes it is given (the planner's, with other tiles here:
    the same bytes) and refuses a pass planned for another output."""
    q, k, v = _nasty(1, 2, 1, 45, 70, 64, 64, seed=9, device=device)
    rules = ("uos",) * 3
    want = _new(q, k, v, rules, True, 0.125, 64, 32, True)
    tiles = prepass.PREPASS_TILES | {"qk_rows": (32, 1), "v_packed": (32, 1)}
    common = dict(hadamard=True, out_bf16=False, elem="e2m1", smoothed=False, tiles=tiles)
    passes = (
        qk_pass(q, 64, **common, fold="q"),
        qk_pass(k, 96, **common, fold="k"),
        v_pass(v, 96, out_bf16=False, elem="e2m1", anchors=True, tiles=tiles),
    )
    assert [p.rows for p in passes] == [32, 32, 32]
    kw = dict(hadamard=True, scale=0.125, q_len_multiple=64, k_len_multiple=32, slots=True)
    _assert_same(want, fp8_operands_from_inputs(q, k, v, rules, **kw, passes=passes))
    with pytest.raises(ValueError, match="pass_plan"):
        fp8_operands_from_inputs(q, k, v, rules, **kw, passes=(passes[1], passes[1], passes[2]))
