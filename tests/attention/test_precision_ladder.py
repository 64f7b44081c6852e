"""Element ladders per operand: PNQ's row sums hold for every ladder of P~.

docs/design.md, 'Precision ladder and smoothing'.
"""

from __future__ import annotations

import dataclasses
import inspect

import pytest
import torch

import mxattention as mx
from mxattention.attention.config import MX_FORMATS, AttentionConfig, QuantSpec
from tests.attention.conftest import outlier_qkv


def _pv(fmt: str, *, pnq: bool, rule: str = "uos") -> AttentionConfig:
    qk, pv = QuantSpec("mxfp4"), QuantSpec(fmt, rule)
    return AttentionConfig("pv", qk, qk, pv, pv, hadamard=True, pnq=pnq)


@pytest.mark.parametrize("fmt", MX_FORMATS)
def test_pnq_rows_sum_to_one_on_every_ladder(fmt):
    q, k, _ = outlier_qkv(lq=160, lk=200, seed=1)
    # V = 1 is exact on every ladder under UOS (1 = 2**emax * 2**-emax), so O is the row sum.
    out = mx.scaled_dot_product_attention(q, k, torch.ones_like(k), method=_pv(fmt, pnq=True), is_causal=True)
    assert (out - 1).abs().max().item() <= 1e-6


def test_direct_placement_is_off_for_mxfp8_too():
    q, k, _ = outlier_qkv(lq=160, lk=200, seed=1)
    out = mx.scaled_dot_product_attention(q, k, torch.ones_like(k), method=_pv("mxfp8_e4m3", pnq=False))
    assert (out - 1).abs().max().item() > 1e-4  # smaller than MXFP4's, still measurable


@pytest.mark.parametrize(("fmt", "most"), [("mxfp6_e2m3", 0.35), ("mxfp8_e4m3", 0.35)])
def test_wider_pv_ladders_are_closer_to_fp(fmt, most):
    """With Q, K in fp32 the error is P~V's alone: MXFP6 / MXFP8 beat MXFP4 by a wide margin."""
    q, k, v = outlier_qkv(lq=128, lk=128, seed=3)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v)

    def err(f):
        s = QuantSpec(f)
        out = mx.scaled_dot_product_attention(q, k, v, method=AttentionConfig("pv", v=s, p=s, pnq=True))
        return float((out - ref).norm() / ref.norm())

    assert err(fmt) < most * err("mxfp4")


def test_ladder_presets():
    mx4, mx8 = QuantSpec("mxfp4", "uos"), QuantSpec("mxfp8_e4m3", "uos")
    pv8 = mx.get_method("mxattention-pv8")
    assert (pv8.q, pv8.k, pv8.v, pv8.p) == (mx4, mx4, mx8, mx8)
    assert pv8.hadamard and pv8.pnq and not (pv8.smooth_q or pv8.smooth_k)
    smooth = mx.get_method("mxattention-pv8-smooth")
    assert smooth.smooth_q and dataclasses.replace(smooth, name=pv8.name, smooth_q=False) == pv8
    full8 = mx.get_method("mxfp8")
    assert {full8.q, full8.k, full8.v, full8.p} == {mx8} and full8.hadamard and full8.pnq
    assert inspect.signature(mx.scaled_dot_product_attention).parameters["method"].default == "mxattention"
