"""help() of the public entries says the shapes, what raises and what runs where (issue 27)."""

from __future__ import annotations

import inspect

import pytest

import mxattention
from mxattention.formats import fake_quantize, mx_quantize

COMPUTE = [mxattention.scaled_dot_product_attention, mxattention.varlen_attention, mxattention.patch_sdpa]


def _diffusers_entries():
    pytest.importorskip("diffusers")
    from mxattention.integrations import register_diffusers_backend, register_diffusers_varlen_backend

    return [register_diffusers_backend, register_diffusers_varlen_backend]


@pytest.mark.parametrize("diffusers", [False, True], ids=["core", "diffusers"])
def test_entries_say_what_runs_where_and_what_raises(diffusers):
    for fn in _diffusers_entries() if diffusers else COMPUTE:
        doc = inspect.getdoc(fn)
        assert "Raises" in doc, fn.__name__
        assert "PyTorch reference" in doc and "CUDA" in doc, fn.__name__
        assert "fp32 / fp16 / bf16" in doc or "fp32, fp16" in doc, fn.__name__
        assert "[B, " in doc or "[total_q, " in doc, fn.__name__


def test_casts_and_enable_disable_say_what_raises():
    for fn in (mx_quantize, fake_quantize, mxattention.enable, mxattention.disable):
        assert "raise" in inspect.getdoc(fn).lower(), fn.__name__
    assert "fp32 / fp16 / bf16" in inspect.getdoc(mx_quantize)
