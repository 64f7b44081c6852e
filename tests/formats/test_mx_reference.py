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


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_match_reference(dtype):
    ladder = LADDERS["e2m1"]
    x = hard_values(ladder, 32 * 2048, seed=5, dtype=dtype).reshape(-1, 32)
    want, _ = ref_fake_quantize(x.float().numpy(), "ceil", 7.25, ladder)
    got = fake_quantize(x, rule="uos")
    assert got.dtype == dtype
    np.testing.assert_array_equal(got.float().numpy(), torch.from_numpy(want).to(dtype).float().numpy())
