"""The fast mode's switch and its emulation in the reference (`AttentionConfig.mma`, `attention.fast`,
docs/fast_mode.md): the exact method wherever every block folds, the folded operands elsewhere."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from mxattention.attention.config import PRESETS, AttentionConfig, QuantSpec, get_method
from mxattention.attention.fast import fold_operands, fold_p_values, fold_report
from mxattention.attention.operands import prepare_operands, quantize_p
from mxattention.attention.reference import reference_attention

FAST = PRESETS["mxattention-fast"]
EXACT = PRESETS["mxattention"]


def test_the_switch_is_a_named_frozen_field_default_exact():
    assert AttentionConfig().mma == "exact" and all(
        c.mma == "exact" for n, c in PRESETS.items() if n != FAST.name
    )
    assert dataclasses.replace(EXACT, name=FAST.name, notes=FAST.notes, mma="fp8") == FAST
    assert "mma fp8" in FAST.describe() and "mma" not in EXACT.describe()
    assert AttentionConfig.from_dict(json.loads(json.dumps(FAST.to_dict()))) == FAST
    with pytest.raises(dataclasses.FrozenInstanceError):
        FAST.mma = "exact"


def test_bad_mma_values_name_the_field():
    with pytest.raises(ValueError, match=r"AttentionConfig\.mma must be one of"):
        dataclasses.replace(EXACT, mma="int8")
    with pytest.raises(TypeError, match=r"AttentionConfig\.mma must be a str"):
        dataclasses.replace(EXACT, mma=8)
    # 8-bit P~ / V do not fold exactly: the pv8 presets keep the exact path.
    with pytest.raises(ValueError, match=r"mma='fp8'.*operand\(s\) v/p not MXFP4"):
        dataclasses.replace(get_method("mxattention-pv8"), mma="fp8")
    with pytest.raises(ValueError, match=r"mma='fp8'.*q/k/v/p not MXFP4"):
        dataclasses.replace(get_method("fp"), mma="fp8")
    with pytest.raises(ValueError, match=r"p_row_scale"):
        AttentionConfig("x", *(QuantSpec(),) * 4, p_row_scale=2.0, mma="fp8")


def _qkv(lq: int, lk: int, d: int, seed: int, spread: float = 0.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, d, generator=g) for n in (lq, lk, lk))
    if spread:  # per-token magnitudes over 2 * spread binades: blocks outside the exact fold
        q = q * torch.exp2(spread * (2 * torch.rand(1, 2, lq, 1, generator=g) - 1))
        k = k * torch.exp2(spread * (2 * torch.rand(1, 2, lk, 1, generator=g) - 1))
        v = v * torch.exp2(spread * (2 * torch.rand(1, 2, lk, 1, generator=g) - 1))
    return q, k, v


def test_emulation_equals_the_exact_method_bit_for_bit_where_every_block_folds():
    q, k, v = _qkv(45, 100, 64, seed=0)
    cfg = EXACT.with_tiles(block_n=32)
    ops = prepare_operands(q, k, v, cfg)
    rep = fold_report(ops.q, ops.k, ops.v)
    assert all(rep[n]["blocks"] == 0 for n in "qkv")
    o1, l1 = reference_attention(q, k, v, cfg, scale=0.125)
    o2, l2 = reference_attention(q, k, v, dataclasses.replace(cfg, mma="fp8", name="f"), scale=0.125)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)


def test_emulation_consumes_the_folded_operands_and_tile():
    q, k, v = _qkv(33, 70, 64, seed=1, spread=9.0)
    v[..., 32:64, :] *= 2.0**-20  # a V block 20 binades under its columns' tops
    ex = prepare_operands(q, k, v, EXACT)
    fa = prepare_operands(q, k, v, FAST)
    rep = fold_report(ex.q, ex.k, ex.v)
    assert rep["k"]["blocks"] > 0 and rep["v"]["blocks"] > 0, rep  # the spread leaves some outside
    for got, want in zip((fa.q, fa.k, fa.v), fold_operands(ex.q, ex.k, ex.v), strict=True):
        assert torch.equal(got, want)
    assert not torch.equal(fa.k, ex.k)
    p = torch.rand(3, 96, generator=torch.Generator().manual_seed(5))
    p[:, 0], p[:, 32:64] = 1.0, p[:, 32:64] * 2.0**-20  # a P~ block under 2**-16: it rounds
    assert torch.equal(quantize_p(p, FAST), fold_p_values(quantize_p(p, EXACT)))
    assert not torch.equal(quantize_p(p, FAST), quantize_p(p, EXACT))


def test_induced_weights_sum_to_one_per_row_with_outliers():
    # V = identity: O's rows are the induced weights (the folded P~ over the l the method divides by).
    lk = 100
    q, k, _ = _qkv(40, lk, 64, seed=2, spread=10.0)
    v = torch.eye(lk).expand(1, 2, lk, lk)
    w, _ = reference_attention(q * 4, k * 4, v, FAST.with_tiles(block_n=32), scale=0.125)
    assert (w.sum(-1) - 1).abs().max() < 1e-3
    assert (w >= 0).all()


def _dit_like(lq: int, lk: int, d: int, seed: int):
    """DiT-like Q, K, V: a few channels x 20 and per-channel offsets."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, 2, n, d, generator=g) for n in (lq, lk, lk))
    chan = torch.ones(d)
    chan[torch.randperm(d, generator=g)[:4]] = 20.0
    q = q * chan + 3.0 * torch.randn(d, generator=g)
    k = k * chan + 3.0 * torch.randn(d, generator=g)
    return q, k, v * torch.exp(0.5 * torch.randn(d, generator=g)) + torch.randn(d, generator=g)


@pytest.mark.parametrize("kind", ["outlier-heavy", "dit-like"])
def test_deviation_is_at_most_2_percent_of_the_methods_own_error(kind):
    # Issue 29's bound: rel-L2(O_fast, O_exact) <= 2 % of rel-L2(O_exact, O_fp32), with blocks outside
    # the fold (outlier-heavy: keys over 24 binades, tiny P~ blocks) or channel outliers and offsets.
    if kind == "outlier-heavy":
        q, k, v = _qkv(60, 90, 64, seed=7, spread=12.0)
    else:
        q, k, v = _dit_like(60, 90, 64, seed=8)
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    fast, _ = reference_attention(q, k, v, FAST.with_tiles(block_n=32), scale=0.125)
    exact, _ = reference_attention(q, k, v, EXACT.with_tiles(block_n=32), scale=0.125)
    fp, _ = reference_attention(q, k, v, get_method("fp"), scale=0.125)
    assert rel(fast, exact) <= 0.02 * rel(exact, fp)
    if kind == "outlier-heavy":
        ops = prepare_operands(q, k, v, EXACT)
        assert fold_report(ops.q, ops.k, ops.v)["k"]["blocks"] > 0  # the bound holds with blocks outside
