"""The xDiT (xfuser 0.7.0) backend on the CPU: xfuser's registry and dispatch, a 2-chunk ring merge,
a world-size-1 USP through xfuser's own Wan transformer, and torch.compile.

Two limits of xfuser on a CPU-only machine shape these tests:

- xfuser cannot be imported with a CPU-only torch: `xfuser.config.config` reads `xfuser.envs.CUDA_VERSION`
  while importing, and that raises NotImplementedError("No Accelerators ...") unless torch is a CUDA /
  ROCm build or MPS, MUSA or NPU is available. `_import_xfuser` reports MPS as available for the
  duration of the import only (xfuser then takes its CUDA version as "0.0"); xfuser's source is not
  touched, and on a CUDA torch nothing is faked.
- Ring and Ulysses degrees > 1 need xfuser's process groups, which it builds (through yunchang) only
  where CUDA is available (`usp.PROCESS_GROUP` is None otherwise), so USP runs here at world size 1
  (gloo): xfuser's dispatch calls the registered function once with all keys. The ring's merge is
  checked in one process with torch's `_SDPAMerger`, the code xfuser's `ring_attn` runs through
  `_templated_ring_attention`, over two key chunks.
"""

from __future__ import annotations

import importlib.util
import types
import warnings
from unittest import mock

import pytest
import torch

if importlib.util.find_spec("xfuser") is None:  # importorskip would import it without `_import_xfuser`
    pytest.skip("xfuser is not installed", allow_module_level=True)

from mxattention import FallbackError, FallbackWarning, InferenceOnlyError, merge_attention
from mxattention import scaled_dot_product_attention as mx_sdpa
from mxattention.attention.config import get_method
from mxattention.attention.reference import reference_attention
from mxattention.integrations import PrecisionPolicy, register_xdit_backend, xdit_backend_stats
from mxattention.integrations.xdit import reset_xdit_backend_stats
from mxattention.ops import ReferenceFallbackWarning
from tests.integrations import tiny_models
from tests.integrations.tiny_models import rel_l2

B, H, S, D = 1, 2, 128, 64
SMOOTH_METHODS = ("mxattention", "mxattention-pv8-smooth")

pytestmark = pytest.mark.filterwarnings("ignore::mxattention.ops.ReferenceFallbackWarning")


def _import_xfuser() -> types.SimpleNamespace:
    cpu_only = torch.version.cuda is None and torch.version.hip is None
    with mock.patch.object(torch.backends.mps, "is_available", lambda: True) if cpu_only else _nothing():
        from xfuser.core.distributed import attention_backend, parallel_state, runtime_state
        from xfuser.model_executor.layers import usp
        from xfuser.model_executor.models.transformers.transformer_wan import xFuserWanTransformer3DWrapper
    return types.SimpleNamespace(
        ab=attention_backend, ps=parallel_state, rs=runtime_state, usp=usp, Wan=xFuserWanTransformer3DWrapper
    )


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _xfuser_wan(xf: types.SimpleNamespace) -> torch.nn.Module:
    """xfuser's Wan wrapper with tiny_models.wan()'s config and weights (same seed, same init order)."""
    torch.manual_seed(0)
    return xf.Wan(**tiny_models.WAN_CONFIG).eval()


@pytest.fixture(scope="module")
def xf(tmp_path_factory):
    """xfuser imported, a world-size-1 gloo group, xfuser's model-parallel groups and its DiT runtime state."""
    xf = _import_xfuser()
    if torch.distributed.is_initialized():
        pytest.skip("a torch.distributed process group already exists in this process")
    init = tmp_path_factory.mktemp("xdit") / "init"
    xf.ps.init_distributed_environment(
        world_size=1, rank=0, distributed_init_method=f"file://{init}", backend="gloo"
    )
    try:
        xf.ps.initialize_model_parallel(backend="gloo")
        from xfuser.config import xFuserArgs

        config, _ = xFuserArgs().create_config()
        xf.wan = _xfuser_wan(xf)
        xf.rs.initialize_runtime_state(
            pipeline=types.SimpleNamespace(transformer=xf.wan), engine_config=config
        )
        yield xf
    finally:
        xf.rs._RUNTIME = None
        xf.ps.destroy_model_parallel()
        xf.ps.destroy_distributed_environment()


def _qkv(seed: int = 0, dtype: torch.dtype = torch.float32):
    """[B, H, S, D] (xfuser's layout). A common Q offset (what Q smoothing takes off) and a few large
    Q / K channels make the softmax peaky and the smoothing matter."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, S, D, generator=g) for _ in range(3))
    q[..., :4] *= 3.0
    k[..., :4] *= 3.0
    q += 1.5 * torch.randn(1, 1, 1, D, generator=g)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _dispatch(xf, member):
    """The registered function as USP and xfuser's ring call it (`_get_attention_function`)."""
    fn = xf.usp._get_attention_function(member)
    return lambda q, k, v, is_causal=False, kw=None: fn(
        q, k, v, dropout_p=0.0, is_causal=is_causal, attention_kwargs=kw
    )


def test_registered_the_way_xfusers_backends_are(xf):
    member = register_xdit_backend("mxattention")
    assert member is xf.ab.AttentionBackendType["MXATTENTION"] and member.name == "MXATTENTION"
    assert xf.ab.ATTENTION_FUNCTION_REGISTRY[member].__name__ == "mxattention_xdit[MXATTENTION]"
    assert register_xdit_backend("mxattention") is member  # same options: nothing changes
    smooth = register_xdit_backend("mxattention-pv8-smooth")
    assert smooth.name == "MXATTENTION_PV8_SMOOTH" and xdit_backend_stats(smooth.name)["method"] == (
        "mxattention-pv8-smooth"
    )
    state = xf.rs.get_runtime_state()
    try:
        state.set_attention_backend("mxattention")  # xfuser's own lookup (--attention_backend mxattention)
        assert state.attention_backend is member
    finally:
        state.set_attention_backend("SDPA")
    with pytest.raises(ValueError, match="one of xfuser's own"):
        register_xdit_backend("fp", name="SDPA")
    with pytest.raises(ValueError, match="upper case"):
        register_xdit_backend("fp", name="mxattention")
    with pytest.raises(TypeError, match="PrecisionPolicy"):
        register_xdit_backend("fp", policy="native")
    with pytest.raises(ValueError, match="no mxattention xDiT backend"):
        xdit_backend_stats("NOT_REGISTERED")


@pytest.mark.parametrize("method", SMOOTH_METHODS)
def test_function_returns_the_dense_calls_bits_and_the_references_lse(xf, method):
    attend = _dispatch(xf, register_xdit_backend(method))
    q, k, v = _qkv()
    out, lse = attend(q, k, v)
    want, want_lse = mx_sdpa(q, k, v, method=method, return_lse=True)
    assert torch.equal(out, want) and torch.equal(lse, want_lse)
    assert lse.shape == (B, H, S) and lse.dtype == torch.float32
    _, ref_lse = reference_attention(q, k, v, get_method(method), scale=D**-0.5)
    assert torch.equal(lse, ref_lse)
    # bf16 in: out in bf16, the lse still fp32; causal and a key mask pass through.
    qb, kb, vb = (x.bfloat16() for x in (q, k, v))
    out_b, lse_b = attend(qb, kb, vb, is_causal=True)
    want_b, want_lse_b = mx_sdpa(qb, kb, vb, is_causal=True, method=method, return_lse=True)
    assert out_b.dtype == torch.bfloat16 and lse_b.dtype == torch.float32
    assert torch.equal(out_b, want_b) and torch.equal(lse_b, want_lse_b)


def test_lse_is_the_natural_log_of_the_scores(xf):
    attend = _dispatch(xf, register_xdit_backend("fp"))
    q, k, v = _qkv()
    _, lse = attend(q, k, v)
    exact = torch.logsumexp((q.double() @ k.double().transpose(-1, -2)) * D**-0.5, dim=-1)
    torch.testing.assert_close(lse.double(), exact, atol=1e-4, rtol=1e-6)


def test_xfusers_padding_metadata_is_honoured(xf):
    attend = _dispatch(xf, register_xdit_backend("mxattention"))
    q, k, v = _qkv()
    valid = S - 40
    key_mask = (torch.arange(S) < valid).expand(B, S)
    want = mx_sdpa(q, k, v, key_mask[:, None, None, :])
    trimmed = mx_sdpa(q, k[:, :, :valid], v[:, :, :valid])
    # xfuser's AttentionMaskWithMeta hands SDPA backends its [B, 1, 1, S] bool mask ...
    assert torch.equal(attend(q, k, v, kw={"attn_mask": key_mask[:, None, None, :]})[0], want)
    # ... its varlen indices alone mean the same keys; valid_kv_len drops the trailing padding.
    indices = key_mask.flatten().nonzero().flatten()
    assert torch.equal(attend(q, k, v, kw={"indices_k": indices, "cu_seqlens_k": None})[0], want)
    assert torch.equal(attend(q, k, v, kw={"valid_kv_len": valid, "indices_k": indices})[0], trimmed)
    assert torch.equal(attend(q, k, v, kw={"thw": (1, 8, 16), "scale": 1.0})[0], mx_sdpa(q, k, v))
    with pytest.raises(ValueError, match="use Ulysses"):  # a ring chunk with the whole mask
        attend(q, k[:, :, : S // 2], v[:, :, : S // 2], kw={"attn_mask": key_mask[:, None, None, :]})


@pytest.mark.parametrize("method", SMOOTH_METHODS)
def test_two_chunk_ring_merge_with_the_lse(xf, method):
    from torch.distributed.tensor.experimental._context_parallel._attention import (
        _cp_options,
        _SDPAMerger,
        _templated_ring_attention,
    )

    member = register_xdit_backend(method)
    attend = _dispatch(xf, member)
    q, k, v = _qkv()
    one, one_lse = attend(q, k, v)
    # xfuser's ring_attn call, verbatim but for the group (its ring group exists only with CUDA): at
    # world size 1 one step, the single call's bits.
    kwargs = {"dropout_p": 0.0, "is_causal": False, "joint_attn_kwargs": None, "attention_kwargs": None}
    fn = xf.usp._get_attention_function(member)
    balance, _cp_options.enable_load_balance = _cp_options.enable_load_balance, False  # as ring_attn sets it
    try:
        ring1, ring1_lse = _templated_ring_attention(torch.distributed.group.WORLD, 1, fn, q, k, v, **kwargs)
    finally:
        _cp_options.enable_load_balance = balance
    assert torch.equal(ring1, one) and torch.equal(ring1_lse, one_lse)
    fp, fp_lse = mx_sdpa(q, k, v, method="fp", return_lse=True)
    pieces = [attend(q, kc, vc) for kc, vc in zip(k.chunk(2, dim=2), v.chunk(2, dim=2), strict=True)]
    merger = _SDPAMerger(True, seq_dim=2)  # xfuser's ring merge (torch's _templated_ring_attention)
    for o, s in pieces:
        merger.step(o, s, False)
    ring, ring_lse = merger.results()
    merged, merged_lse = merge_attention([o for o, _ in pieces], [s for _, s in pieces])
    torch.testing.assert_close(ring, merged, atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(ring_lse, merged_lse, atol=2e-5, rtol=1e-6)
    # Each chunk's lse is that of its keys' scores (the Q-smoothing correction qm K^T included) ...
    for (_, s), kc, vc in zip(pieces, k.chunk(2, dim=2), v.chunk(2, dim=2), strict=True):
        _, exact = mx_sdpa(q, kc, vc, method="fp", return_lse=True)
        assert (s - exact).abs().mean() < 0.5, (s - exact).abs().mean()  # 0.30 / 0.19 measured
    # ... so the merge lands next to the single call: P~ is quantized against the running max of the
    # keys seen, so the split moves the result, but far less than quantizing does.
    error = rel_l2(one, fp)
    assert rel_l2(ring, one) < 0.25 * error
    assert rel_l2(ring, fp) < 1.1 * error
    assert (ring_lse - one_lse).abs().max() < 0.2
    assert (ring_lse - fp_lse).abs().mean() < 1.1 * (one_lse - fp_lse).abs().mean()


def test_q_smoothing_pays_off_on_an_offset_query(xf):
    q, k, v = _qkv()
    fp = mx_sdpa(q, k, v, method="fp")
    plain = rel_l2(_dispatch(xf, register_xdit_backend("mxattention-pv8"))(q, k, v)[0], fp)
    smooth = rel_l2(_dispatch(xf, register_xdit_backend("mxattention-pv8-smooth"))(q, k, v)[0], fp)
    assert smooth < 0.8 * plain, (smooth, plain)


def test_fallbacks_count_warn_and_strict_raises(xf):
    member = register_xdit_backend("mxattention", name="MXATTENTION_FALLBACKS")
    attend = _dispatch(xf, member)
    q, k, v = (x.double() for x in _qkv())
    with pytest.warns(FallbackWarning, match="'dtype'"):
        out, lse = attend(q, k, v)
    want, want_lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False)
    assert torch.equal(out, want) and torch.equal(lse, want_lse.float())
    stats = xdit_backend_stats(member.name)
    assert stats["fallback_reasons"] == {"dtype": 1} and stats["routed"] == 0
    fn = xf.ab.ATTENTION_FUNCTION_REGISTRY[member]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        with pytest.raises(ValueError, match="log-sum-exp"):
            fn(*_qkv(), dropout_p=0.1, is_causal=False)
    strict = register_xdit_backend("mxattention", name="MXATTENTION_FALLBACKS", strict=True)
    with pytest.raises(FallbackError, match="strict"):
        xf.ab.ATTENTION_FUNCTION_REGISTRY[strict](q, k, v, dropout_p=0.0, is_causal=False)
    q, k, v = (x.requires_grad_() for x in _qkv())
    out, _ = _dispatch(xf, register_xdit_backend("mxattention"))(q, k, v)
    with pytest.raises(InferenceOnlyError):
        out.sum().backward()


def test_usp_at_world_size_one_through_xfusers_wan(xf):
    """xfuser's Wan wrapper: self-attention through USP, cross-attention through `attention`."""
    from diffusers.models.attention_dispatch import attention_backend

    from mxattention.integrations import register_diffusers_backend

    state = xf.rs.get_runtime_state()
    inputs = tiny_models.wan_inputs()
    member = register_xdit_backend("mxattention")
    reset_xdit_backend_stats(member.name)
    try:
        with torch.no_grad():
            state.set_attention_backend("SDPA")
            native = xf.wan(**inputs)[0]
            state.set_attention_backend(member)
            got = xf.wan(**inputs)[0]
            policy = PrecisionPolicy(layers={0})
            state.set_attention_backend(
                register_xdit_backend("mxattention", name="MXATTENTION_B0", policy=policy)
            )
            with policy.attach(xf.wan):
                kept = xf.wan(**inputs)[0]
    finally:
        state.set_attention_backend("SDPA")
    assert xdit_backend_stats(member.name)["routed"] == 4  # 2 blocks x (self, cross)
    assert xdit_backend_stats("MXATTENTION_B0")["high_precision"] == 2
    assert xdit_backend_stats("MXATTENTION_B0")["routed"] == 2
    # The same model under diffusers with mxattention's diffusers backend: the same attention.
    model = tiny_models.wan()
    register_diffusers_backend("mxattention")
    with torch.no_grad(), attention_backend("mxattention"):
        via_diffusers = model(**inputs)[0]
    assert rel_l2(got, via_diffusers) < 1e-5
    error = rel_l2(got, native)
    assert 1e-3 < error < 0.2  # quantized, and close to the native model
    assert rel_l2(kept, native) < error  # block 0 kept in high precision


def test_compiled_usp_is_one_routed_node(xf):
    from tests.integrations.test_compile import ROUTED, Graphs

    member = register_xdit_backend("mxattention")
    q, k, v = _qkv()

    def call(q, k, v):
        return xf.usp.USP(q, k, v, backend=member)

    graphs = Graphs()
    torch._dynamo.reset()
    reset_xdit_backend_stats(member.name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReferenceFallbackWarning)
        compiled = torch.compile(call, backend=graphs, fullgraph=True)
        outs = [compiled(q, k, v), compiled(q, k, v)]
    torch._dynamo.reset()
    eager = call(q, k, v)
    assert all(torch.equal(o, eager) for o in outs)
    assert graphs.count(ROUTED) == 1
    assert xdit_backend_stats(member.name)["routed"] == 3  # two compiled runs, one eager
