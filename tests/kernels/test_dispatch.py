"""The public function: which path runs, the one warning per reason, and torch.compile without breaks."""

import dataclasses
import warnings

import pytest
import torch

import mxattention as mx
from mxattention.attention import keys
from mxattention.attention.config import PRESETS
from mxattention.attention.reference import reference_attention
from mxattention.kernels._triton import kernels_interpreted
from mxattention.kernels.fused import fused_attention, unsupported_reason
from mxattention.ops import errors as op

from .helpers import qkv


@pytest.fixture(autouse=True)
def _fresh_warnings():
    op._WARNED.clear()
    yield
    op._WARNED.clear()


def test_method_key_round_trip():
    for cfg in PRESETS.values():
        assert keys.config_from_key(keys.method_key(cfg)) == cfg


def _fallbacks(record):
    return [w for w in record if issubclass(w.category, op.ReferenceFallbackWarning)]


def test_cpu_uses_reference_and_warns_once(monkeypatch):
    monkeypatch.delenv("MXATTENTION_CPU_KERNELS", raising=False)
    q, k, v = qkv(1, 2, 2, 20, 30, 64)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = mx.scaled_dot_product_attention(q, k, v)
        mx.scaled_dot_product_attention(q, k, v)
    (w,) = _fallbacks(rec)
    assert "cpu" in str(w.message)
    ref, _ = reference_attention(q, k, v, mx.get_method("mxattention"), scale=64**-0.5)
    assert torch.equal(out, ref)


# MXATTENTION_CPU_KERNELS sends CPU tensors to the kernels only where Triton interprets them.
cpu_kernels = pytest.mark.skipif(
    not kernels_interpreted(), reason="needs TRITON_INTERPRET=1 (a CPU-only run)"
)


@cpu_kernels
def test_nvfp4_reason(monkeypatch):
    monkeypatch.setenv("MXATTENTION_CPU_KERNELS", "1")
    q, k, v = qkv(1, 1, 1, 16, 32, 64)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        mx.scaled_dot_product_attention(q, k, v, method="nvfp4")
        mx.scaled_dot_product_attention(q, k, v, method="nvfp4-sage")
    msgs = [str(w.message) for w in _fallbacks(rec)]
    assert len(msgs) == 2 and "NVFP4" in msgs[0]


@pytest.mark.parametrize("fmt", ["mxfp6_e2m3", "mxfp6_e3m2", "mxfp8_e4m3", "mxfp8_e5m2"])
def test_other_ladders_have_a_named_reason(monkeypatch, fmt):
    """The kernels compute E2M1 or E4M3 operands, Q and K on the same ladder: any other ladder, on
    any operand, and Q or K alone in E4M3, go to the reference with the formats named."""
    if not (torch.cuda.is_available() or kernels_interpreted()):
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    monkeypatch.setenv("MXATTENTION_CPU_KERNELS", "1")
    q = qkv(1, 1, 1, 16, 32, 64)[0].to("cuda" if torch.cuda.is_available() else "cpu")
    s4, s = mx.QuantSpec("mxfp4"), mx.QuantSpec(fmt)
    assert unsupported_reason(mx.AttentionConfig("t", s4, s4, s4, s4, pnq=True), q, 64, 64) is None
    served = {"mxfp8_e4m3": 2}.get(fmt, 0)  # how many of (V, P~) the kernels take in this format
    for i, ops in enumerate(((s, s4, s4, s4), (s4, s, s4, s4), (s4, s4, s, s4), (s4, s4, s4, s))):
        reason = unsupported_reason(mx.AttentionConfig("t", *ops, pnq=True), q, 64, 64)
        if i >= 4 - served:
            assert reason is None
        else:
            assert reason is not None and fmt in reason


def test_pv8_presets_take_the_kernels(monkeypatch):
    """mxattention-pv8, mxfp8 and mxattention-pv8-smooth run on the kernels (a varlen call with Q
    smoothing as dense calls per sequence, for its reason), SageAttention's K smoothing and a smoothing block that
    is not a multiple of the query tiles do not."""
    from mxattention.kernels.fused_varlen import varlen_reason

    if not (torch.cuda.is_available() or kernels_interpreted()):
        pytest.skip("needs CUDA or TRITON_INTERPRET=1")
    monkeypatch.setenv("MXATTENTION_CPU_KERNELS", "1")
    q = qkv(1, 1, 1, 16, 32, 64)[0].to("cuda" if torch.cuda.is_available() else "cpu")
    assert unsupported_reason(mx.get_method("mxattention-pv8"), q, 64, 64) is None
    assert unsupported_reason(mx.get_method("mxfp8"), q, 64, 64) is None
    smooth = mx.get_method("mxattention-pv8-smooth")
    assert unsupported_reason(smooth, q, 64, 64) is None
    assert "smooths Q" in varlen_reason(smooth) and varlen_reason(mx.get_method("mxattention")) is None
    odd = dataclasses.replace(smooth, smooth_q_block=100)
    assert "smooth_q_block=100" in unsupported_reason(odd, q, 64, 64)
    k_smoothed = dataclasses.replace(smooth, smooth_k=True)
    assert "K smoothing" in unsupported_reason(k_smoothed, q, 64, 64)


@cpu_kernels
def test_kernel_path_through_public_function(monkeypatch):
    """With MXATTENTION_CPU_KERNELS=1 CPU tensors take the (interpreted) kernels: GQA, mask, lse."""
    monkeypatch.setenv("MXATTENTION_CPU_KERNELS", "1")
    q, k, v = qkv(1, 4, 2, 40, 70, 64)
    mask = torch.rand(1, 1, 1, 70) > 0.2
    with warnings.catch_warnings():
        warnings.simplefilter("error", op.ReferenceFallbackWarning)
        out, lse = mx.scaled_dot_product_attention(q, k, v, mask, enable_gqa=True, return_lse=True)
    want, want_lse, _ = fused_attention(
        q, k, v, mx.get_method("mxattention"), mask=mask.expand(1, 4, 40, 70), scale=0.125
    )
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("kernels", ["0", "1"])
def test_compile_fullgraph(monkeypatch, kernels):
    monkeypatch.setenv("MXATTENTION_CPU_KERNELS", kernels)
    torch._dynamo.reset()
    q, k, v = qkv(1, 2, 2, 24, 40, 64)
    mask = torch.rand(1, 1, 1, 40) > 0.3

    def f(q, k, v, mask):
        return mx.scaled_dot_product_attention(q, k, v, mask, method="mxfp4-ocp", return_lse=True)

    compiled = torch.compile(f, fullgraph=True, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", op.ReferenceFallbackWarning)
        out, lse = compiled(q, k, v, mask)
        want, want_lse = f(q, k, v, mask)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)


def test_inputs_requiring_grad_quantize_and_backward_raises():
    q, k, v = qkv(1, 2, 2, 24, 40, 32)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", op.ReferenceFallbackWarning)
        want = mx.scaled_dot_product_attention(q, k, v)
    q.requires_grad_(True)
    compiled = torch.compile(mx.scaled_dot_product_attention, fullgraph=True, backend="aot_eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", op.ReferenceFallbackWarning)
        outs = [mx.scaled_dot_product_attention(q, k, v), compiled(q, k, v)]
    for out in outs:  # eager, then compiled: the forward compiles and runs, the backward raises
        assert torch.equal(out, want) and out.requires_grad
        with pytest.raises(mx.InferenceOnlyError, match="inference-only"):
            out.sum().backward()


@cpu_kernels
def test_narrow_v_on_sm_90_is_a_counted_fallback(monkeypatch):
    """Where the plan refuses head dims a target computes wrong (sm_90: D 128 over Dv 32,
    targets.NARROW_V_BROKEN), the public functions run the reference with one warning naming it."""
    from mxattention.kernels import plan, targets

    monkeypatch.setenv("MXATTENTION_CPU_KERNELS", "1")
    monkeypatch.setattr(plan, "current_target", lambda device: targets.SM_90A)
    q, k, v = qkv(1, 2, 2, 20, 30, 128, dv=32)
    cfg = mx.get_method("mxattention")
    cu = torch.tensor([0, 20], dtype=torch.int32)
    cu_k = torch.tensor([0, 30], dtype=torch.int32)
    packed = (x[0].transpose(0, 1) for x in (q, k, v))
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = mx.scaled_dot_product_attention(q, k, v)
        out_varlen = mx.varlen_attention(*packed, cu, cu_k)
    (w,) = _fallbacks(rec)  # one reason, warned once
    assert "NARROW_V_BROKEN" in str(w.message)
    ref, _ = reference_attention(q, k, v, cfg, scale=128**-0.5)
    assert torch.equal(out, ref) and torch.equal(out_varlen, ref[0].transpose(0, 1))
