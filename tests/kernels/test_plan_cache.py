"""The op's plans are looked up by call signature (`kernels.plan.cached_plan`): a cached plan is the
plan `plan_call` makes of the call's own inputs, whatever the previous call with the same shapes
looked like (strides, alignment, scale, mask, causality, the interpreter switch)."""

from __future__ import annotations

import pytest
import torch

from mxattention.attention.keys import config_from_key
from mxattention.kernels import HAS_TRITON
from mxattention.kernels import plan as kplan
from mxattention.kernels.plan import CPU_KERNELS_ENV

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="plans past the device check need Triton")
BF16 = torch.bfloat16


def _planned(method, q, k, v, scale=0.125, mask=None, is_causal=False):
    cached = kplan.cached_plan(method, q, k, v, scale, mask=mask, is_causal=is_causal)
    fresh = kplan.kernel_plan(config_from_key(method), q, k, v, scale, mask=mask, is_causal=is_causal)
    assert cached == fresh
    return cached


@pytest.fixture(autouse=True)
def _empty_cache(monkeypatch):
    monkeypatch.setattr(kplan, "_PLANS", {})
    monkeypatch.setenv(CPU_KERNELS_ENV, "1")  # the full plan, for the interpreter, on CPU tensors


def test_same_signature_same_plan_object():
    q, k, v = (torch.randn(1, 2, 64, 64, dtype=BF16) for _ in range(3))
    first = _planned("mxattention", q, k, v)
    q2, k2, v2 = (torch.randn(1, 2, 64, 64, dtype=BF16) for _ in range(3))
    assert kplan.cached_plan("mxattention", q2, k2, v2, 0.125) is first
    assert len(kplan._PLANS) == 1


def test_a_call_that_plans_differently_gets_its_own_plan():
    q, k, v = (torch.randn(1, 2, 64, 64, dtype=BF16) for _ in range(3))
    base = _planned("mxattention", q, k, v)
    assert base.chunks[0].q_pass.bf16_pairs
    # Same shapes, a base 2 bytes off: bf16 rows cannot be read as int32 pairs.
    buf = torch.randn(q.numel() + 1, dtype=BF16)
    shifted = buf[1:].view(q.shape)
    assert not _planned("mxattention", shifted, k, v).chunks[0].q_pass.bf16_pairs
    # Same shapes and alignment, odd row stride: no pairs either.
    strided = torch.randn(1, 2, 64, 65, dtype=BF16)[..., :64]
    assert not _planned("mxattention", strided, k, v).chunks[0].q_pass.bf16_pairs
    assert _planned("mxattention", q, k, v, scale=-0.125).scale_op == "negate_q"
    assert _planned("mxattention", q, k, v, is_causal=True) is not base
    assert _planned("mxattention-pv8", q, k, v).p_elem == "e4m3"
    assert _planned("mxattention", q, k, v) is base


def test_the_interpreter_switch_is_part_of_the_signature(monkeypatch):
    q, k, v = (torch.randn(1, 2, 64, 64, dtype=BF16) for _ in range(3))
    _planned("mxattention", q, k, v)
    monkeypatch.setenv(CPU_KERNELS_ENV, "0")
    off = _planned("mxattention", q, k, v)
    assert off.reason is not None and "cpu" in off.reason


def test_the_cache_is_bounded(monkeypatch):
    monkeypatch.setattr(kplan, "PLAN_CACHE_SIZE", 3)
    for n in range(1, 8):
        q = torch.randn(1, 1, n, 32)
        kplan.cached_plan("mxattention", q, q, q, 0.125)
        assert len(kplan._PLANS) <= 3
