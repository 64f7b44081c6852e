"""Every rule and every ladder against the independent float64 reference, on adversarial inputs."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from mxattention.formats import LADDERS
from mxattention.formats.mx import fake_quantize, mx_quantize
from mxattention.formats.scale_rules import ScaleMode, resolve_rule
from tests.formats.hard_values import hard_values
from tests.formats.reference_cast import ref_fake_quantize


@pytest.mark.parametrize("elem", sorted(LADDERS))
@pytest.mark.parametrize("rule", ["ocp", "tfs", "uos", 6.5, 7.0, 8.0])
def test_matches_reference(elem, rule):
    ladder = LADDERS[elem]
    x = hard_values(ladder, 32 * 1024, seed=zlib.crc32(f"{elem}{rule}".encode()) % 1000).reshape(-1, 32)
    r = resolve_rule(rule, ladder)
    mode = "floor" if r.mode is ScaleMode.FLOOR else "ceil"
    want, want_e = ref_fake_quantize(x.numpy(), mode, r.boundary, ladder)
    got = fake_quantize(x, rule=rule, elem=elem)
    with np.errstate(over="ignore"):  # blocks at float32's max dequantize to 2**128 = Inf on both sides
        want = want.astype(np.float32)
    np.testing.assert_array_equal(got.numpy(), want)
    mx = mx_quantize(x, rule=rule, elem=elem)
    nonzero = np.abs(x.numpy()).max(-1) > 0
    np.testing.assert_array_equal(mx.scales[:, 0].numpy().astype(np.int64)[nonzero] - 127, want_e[nonzero])
    assert torch.equal(mx.dequantize(), got)


@pytest.mark.parametrize("rule", ["ocp", "uos"])
@pytest.mark.parametrize("min_exp", [-16, -3, 5])
def test_min_exp_matches_reference(rule, min_exp):
    """`fake_quantize(min_exp=)` (the fast mode's P~ floor) against the reference with the same
    floor on each block's exponent; the floor decides some blocks and leaves the others alone."""
    ladder = LADDERS["e2m1"]
    x = hard_values(ladder, 32 * 512, seed=min_exp + 40).reshape(-1, 32)
    r = resolve_rule(rule, ladder)
    mode = "floor" if r.mode is ScaleMode.FLOOR else "ceil"
    want, _ = ref_fake_quantize(x.numpy(), mode, r.boundary, ladder, min_exp=min_exp)
    with np.errstate(over="ignore"):
        want = want.astype(np.float32)
    got = fake_quantize(x, rule=rule, elem="e2m1", min_exp=min_exp)
    np.testing.assert_array_equal(got.numpy(), want)
    plain = fake_quantize(x, rule=rule, elem="e2m1")
    finite = torch.isfinite(plain).all(-1)
    differ = (got != plain)[finite].any(-1)
    assert 0 < int(differ.sum()) < int(finite.sum())


@pytest.mark.parametrize("bad", [True, 1.5, 200, -128])
def test_min_exp_bad_values_raise(bad):
    with pytest.raises(ValueError, match="min_exp"):
        fake_quantize(torch.ones(32), min_exp=bad)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_match_reference(dtype):
    ladder = LADDERS["e2m1"]
    x = hard_values(ladder, 32 * 2048, seed=5, dtype=dtype).reshape(-1, 32)
    want, _ = ref_fake_quantize(x.float().numpy(), "ceil", 7.25, ladder)
    got = fake_quantize(x, rule="uos")
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.float().numpy(), torch.from_numpy(want).to(dtype).float().numpy())
