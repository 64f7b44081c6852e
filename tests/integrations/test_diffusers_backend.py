"""mxattention as a diffusers attention backend, on real diffusers transformers with tiny configs."""

import warnings

import pytest
import torch

import mxattention

pytest.importorskip("diffusers")

from diffusers.models import attention_dispatch as ad
from diffusers.models.attention_dispatch import AttentionBackendName, attention_backend, dispatch_attention_fn

from mxattention.integrations import backend_stats, register_preset_backends
from mxattention.integrations.diffusers_backend import (
    backend_name,
    register_diffusers_backend,
    reset_backend_stats,
)
from tests.integrations import tiny_models
from tests.integrations.tiny_models import MODELS, rel_l2

# Random-weight tiny models: 4-bit attention moves their output by ~0.2-1.5 % (rel-L2); 10 % would
# mean the attention output is badly wrong, 0 that nothing was quantized.
MX_BOUND = 0.1


@pytest.fixture(scope="module", autouse=True)
def _backends():
    register_preset_backends()


@pytest.fixture(scope="module", params=list(MODELS))
def model_case(request):
    build, make_inputs, calls, mask_shape = MODELS[request.param]
    model = build()
    inputs = make_inputs()
    with torch.no_grad():
        native = model(**inputs)[0]
    return request.param, model, inputs, calls, mask_shape, native


def _run(model, inputs, backend):
    reset_backend_stats(backend)
    with torch.no_grad(), attention_backend(backend):
        out = model(**inputs)[0]
    return out, backend_stats(backend)


def test_registered_names_resolve_through_diffusers():
    assert backend_name("mxattention") == "mxattention"
    assert backend_name("fp") == "mxattention_fp"
    assert backend_name("mxfp4-ocp-hadamard-pnq") == "mxattention_mxfp4_ocp_hadamard_pnq"
    assert backend_name("mxattention-no-hadamard") == "mxattention_no_hadamard"
    member = AttentionBackendName("mxattention")
    assert (
        member == "mxattention" and member.value == "mxattention" and isinstance(member, AttentionBackendName)
    )
    assert AttentionBackendName.MXATTENTION is member
    assert "mxattention_nvfp4_sage" in {m.value for m in AttentionBackendName.__members__.values()}
    assert member in ad._AttentionBackendRegistry._backends
    assert member.value in ad._AttentionBackendRegistry._supports_context_parallel
    # Registering again is a no-op; the names of diffusers' own backends are refused.
    fn = ad._AttentionBackendRegistry._backends[member]
    assert register_diffusers_backend() == "mxattention"
    assert ad._AttentionBackendRegistry._backends[member] is fn
    with pytest.raises(ValueError, match="diffusers' own"):
        register_diffusers_backend("fp", name="native")
    with pytest.raises(ValueError, match="lower case"):
        register_diffusers_backend("fp", name="MyBackend")


def test_fp_method_reproduces_native_backend(model_case):
    name, model, inputs, calls, _, native = model_case
    out, stats = _run(model, inputs, "mxattention_fp")
    assert rel_l2(out, native) <= 1e-5, name
    assert stats["routed"] == calls and stats["fallback"] == 0 and stats["high_precision"] == 0


@pytest.mark.parametrize("method", ["mxattention", "mxfp4-ocp", "nvfp4"])
def test_quantized_methods_differ_boundedly(model_case, method):
    name, model, inputs, calls, _, native = model_case
    out, stats = _run(model, inputs, backend_name(method))
    assert 0 < rel_l2(out, native) < MX_BOUND, (name, method)
    assert stats["routed"] == calls and stats["fallback"] == 0


def test_hunyuan_bool_key_mask_reaches_backend_and_is_honoured():
    model = tiny_models.hunyuan()
    inputs = tiny_models.hunyuan_inputs()
    unmasked = tiny_models.hunyuan_inputs(text_valid=tiny_models.N_TEXT)
    with torch.no_grad():
        native, native_unmasked = model(**inputs)[0], model(**unmasked)[0]
    out, stats = _run(model, inputs, "mxattention_fp")
    n = 128 + tiny_models.N_TEXT
    assert stats["masks"] == {("bool", (1, 1, 1, n)): 2}
    # The padding mask matters for this model, and the backend applies it.
    assert rel_l2(native_unmasked, native) > 1e-3
    assert rel_l2(out, native) <= 1e-5
    out_mx, _ = _run(model, inputs, "mxattention")
    assert 0 < rel_l2(out_mx, native) < MX_BOUND


def test_set_attention_backend_on_the_model():
    model = tiny_models.wan()
    inputs = tiny_models.wan_inputs()
    with torch.no_grad():
        native = model(**inputs)[0]
        with_ctx = _run(model, inputs, "mxattention")[0]
    old = ad._AttentionBackendRegistry._active_backend
    try:
        model.set_attention_backend("mxattention")
        reset_backend_stats("mxattention")
        with torch.no_grad():
            out = model(**inputs)[0]
    finally:
        ad._AttentionBackendRegistry.set_active_backend(old)
    assert torch.equal(out, with_ctx) and not torch.equal(out, native)
    assert backend_stats("mxattention")["routed"] == 4


def _bshd(b, s, h, d, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, s, h, d, generator=g)


@pytest.mark.parametrize(
    ("kwargs", "kv_heads"),
    [
        ({"scale": 0.3}, 4),
        ({"is_causal": True}, 4),
        ({"enable_gqa": True}, 2),
        ({"attn_mask": torch.randn(2, 1, 24, 40)}, 4),  # additive, broadcast over heads
        ({"attn_mask": torch.arange(40).expand(2, 40) % 5 != 1}, 4),  # diffusers' 2-D [B, Sk] key mask
    ],
)
def test_dispatch_arguments_match_native(kwargs, kv_heads):
    q, k, v = _bshd(2, 24, 4, 32, 0), _bshd(2, 40, kv_heads, 32, 1), _bshd(2, 40, kv_heads, 32, 2)
    if kwargs.get("is_causal"):
        k, v = k[:, :24], v[:, :24]
    ref = dispatch_attention_fn(q, k, v, backend=AttentionBackendName.NATIVE, **kwargs)
    out = dispatch_attention_fn(q, k, v, backend="mxattention_fp", **kwargs)
    assert out.shape == ref.shape == (2, 24, 4, 32)
    torch.testing.assert_close(out, ref, atol=2e-6, rtol=1e-5)


def test_lse_layout_for_direct_calls():
    fn = ad._AttentionBackendRegistry._backends[AttentionBackendName("mxattention_fp")]
    q, k, v = _bshd(1, 24, 2, 32, 0), _bshd(1, 40, 2, 32, 1), _bshd(1, 40, 2, 32, 2)
    out, lse = fn(query=q, key=k, value=v, return_lse=True)
    scores = torch.einsum("bqhd,bkhd->bqhk", q, k) / 32**0.5
    assert lse.shape == (1, 24, 2)
    torch.testing.assert_close(lse, torch.logsumexp(scores, dim=-1), atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(
        out, torch.einsum("bqhk,bkhd->bqhd", scores.softmax(-1), v), atol=1e-5, rtol=1e-5
    )


def test_unsupported_calls_fall_back_to_torch_counted():
    q, k, v = _bshd(1, 16, 2, 32, 0), _bshd(1, 16, 2, 32, 1), _bshd(1, 16, 2, 32, 2)
    reset_backend_stats("mxattention")
    torch.manual_seed(3)
    out = dispatch_attention_fn(q, k, v, dropout_p=0.5, backend="mxattention")
    torch.manual_seed(3)
    ref = dispatch_attention_fn(q, k, v, dropout_p=0.5, backend=AttentionBackendName.NATIVE)
    assert torch.equal(out, ref)
    qg = q.clone().requires_grad_(True)
    out = dispatch_attention_fn(qg, k, v, backend="mxattention")  # quantized; no backward
    with pytest.raises(mxattention.InferenceOnlyError, match="autograd='torch'"):
        out.sum().backward()
    dispatch_attention_fn(q.double(), k.double(), v.double(), backend="mxattention")
    stats = backend_stats("mxattention")
    assert stats["fallback_reasons"] == {"dropout": 1, "dtype": 1}
    assert stats["routed"] == 1


def test_strict_autograd_and_warnings_of_a_registration():
    q, k, v = _bshd(1, 16, 2, 32, 0), _bshd(1, 16, 2, 32, 1), _bshd(1, 16, 2, 32, 2)
    try:
        name = register_diffusers_backend("mxattention", name="mxattention_test_opts", autograd="torch")
        qg = q.clone().requires_grad_(True)
        dispatch_attention_fn(qg, k, v, backend=name).sum().backward()  # torch's SDPA: gradients
        ref = q.clone().requires_grad_(True)
        dispatch_attention_fn(ref, k, v, backend=AttentionBackendName.NATIVE).sum().backward()
        assert torch.equal(qg.grad, ref.grad)
        assert backend_stats(name)["fallback_reasons"] == {"autograd": 1}
        register_diffusers_backend("mxattention", name=name, strict=True)
        with pytest.raises(mxattention.FallbackError, match="mxattention_test_opts"):
            dispatch_attention_fn(q.double(), k.double(), v.double(), backend=name)
        register_diffusers_backend("mxattention", name=name)  # a new registration: warns afresh
        model = tiny_models.wan(num_layers=1).double()
        inputs = tiny_models.to(tiny_models.wan_inputs(), "cpu", torch.float64)
        with warnings.catch_warnings(record=True) as rec, torch.no_grad(), attention_backend(name):
            warnings.simplefilter("always")
            model(**inputs)  # fp64: both calls fall back, warned once, at this line
            dispatch_attention_fn(q, k, v, dropout_p=0.5, backend=name)
        assert backend_stats(name)["fallback_reasons"] == {"dtype": 2, "dropout": 1}
    finally:
        register_diffusers_backend("fp", name="mxattention_test_opts")
    dtype, dropout = [w for w in rec if issubclass(w.category, mxattention.FallbackWarning)]
    assert dtype.filename == dropout.filename == __file__
    assert dropout.lineno == dtype.lineno + 1 and "'dtype'" in str(dtype.message)


def test_re_registering_with_another_method_re_points_the_name():
    q, k, v = _bshd(1, 64, 2, 32, 0), _bshd(1, 64, 2, 32, 1), _bshd(1, 64, 2, 32, 2)
    try:
        register_diffusers_backend("fp", name="mxattention_test_swap")
        fp = dispatch_attention_fn(q, k, v, backend="mxattention_test_swap")
        register_diffusers_backend("mxfp4-ocp", name="mxattention_test_swap")
        ocp = dispatch_attention_fn(q, k, v, backend="mxattention_test_swap")
    finally:
        register_diffusers_backend("fp", name="mxattention_test_swap")
    assert backend_stats("mxattention_test_swap")["method"] == "fp"
    assert not torch.equal(fp, ocp)
    torch.testing.assert_close(fp, dispatch_attention_fn(q, k, v, backend="native"), atol=2e-6, rtol=1e-5)
