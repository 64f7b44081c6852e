"""The diffusers varlen backend: each batch row on its valid keys, as per-row dense calls."""

import warnings

import pytest
import torch

import mxattention

pytest.importorskip("diffusers")

from diffusers.models.attention_dispatch import AttentionBackendName, attention_backend, dispatch_attention_fn

from mxattention.integrations.diffusers_backend import (
    register_diffusers_varlen_backend,
    reset_varlen_backend_stats,
    varlen_backend_stats,
)
from mxattention.ops import call
from tests.integrations import tiny_models
from tests.integrations.tiny_models import rel_l2

pytestmark = pytest.mark.filterwarnings("ignore::mxattention.ops.ReferenceFallbackWarning")


@pytest.fixture(scope="module", autouse=True)
def _backends():
    register_diffusers_varlen_backend("mxattention")
    register_diffusers_varlen_backend("fp")


def _bshd(b, s, h, d, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, s, h, d, generator=g)


def _per_row(q, k, v, mask, **kw):
    """One dense mxattention call per batch row on its valid keys, [B, S, H, D] out."""
    rows = []
    for b in range(q.shape[0]):
        keep = mask[b] if mask is not None else slice(None)
        qb, kb, vb = (x[b : b + 1].permute(0, 2, 1, 3) for x in (q, k[:, keep], v[:, keep]))
        rows.append(
            mxattention.scaled_dot_product_attention(qb, kb, vb, enable_gqa=True, **kw).permute(0, 2, 1, 3)
        )
    return torch.cat(rows)


@pytest.mark.parametrize("layout", ["prefix", "scattered", "none"])
def test_rows_equal_dense_calls_on_their_valid_keys(layout, monkeypatch):
    seen = []
    packed = call.packed  # the packed call the op makes of the padded batch
    monkeypatch.setattr(call, "packed", lambda *a, **kw: seen.append(a) or packed(*a, **kw))
    q, k, v = _bshd(3, 24, 4, 32, 0), _bshd(3, 70, 2, 32, 1), _bshd(3, 70, 2, 32, 2)
    n = torch.tensor([70, 33, 5])
    mask = torch.arange(70)[None, :] < n[:, None]  # padding at the end (HunyuanVideo's text mask)
    if layout == "scattered":
        mask = mask[:, torch.randperm(70, generator=torch.Generator().manual_seed(0))]
    mask = None if layout == "none" else mask
    reset_varlen_backend_stats("mxattention_varlen")
    out = dispatch_attention_fn(q, k, v, attn_mask=mask, enable_gqa=True, backend="mxattention_varlen")
    assert torch.equal(out, _per_row(q, k, v, mask))
    # No copy of the keys unless they are scattered (then one gather, as flash_varlen's packing).
    assert (seen[0][1].data_ptr() == k.data_ptr()) == (layout != "scattered")
    assert len(seen[0][3]) == {"prefix": 7, "scattered": 4, "none": 4}[layout]
    stats = varlen_backend_stats("mxattention_varlen")
    assert stats["routed"] == 1 and stats["fallback"] == 0


def test_lse_layout_and_rows_without_keys():
    q, k, v = _bshd(2, 8, 2, 32, 0), _bshd(2, 16, 2, 32, 1), _bshd(2, 16, 2, 32, 2)
    mask = torch.ones(2, 1, 1, 16, dtype=torch.bool)
    mask[1] = False
    from diffusers.models import attention_dispatch as ad

    fn = ad._AttentionBackendRegistry._backends[AttentionBackendName("mxattention_fp_varlen")]
    out, lse = fn(query=q, key=k, value=v, attn_mask=mask, return_lse=True)
    scores = torch.einsum("bqhd,bkhd->bqhk", q, k) / 32**0.5
    assert lse.shape == (2, 8, 2)
    torch.testing.assert_close(lse[0], torch.logsumexp(scores[0], dim=-1), atol=1e-5, rtol=1e-6)
    assert torch.isneginf(lse[1]).all() and (out[1] == 0).all()


def test_other_masks_fall_back_warned_and_strict():
    q, k, v = _bshd(1, 8, 2, 32, 0), _bshd(1, 16, 2, 32, 1), _bshd(1, 16, 2, 32, 2)
    name = register_diffusers_varlen_backend("mxattention", name="mxattention_varlen_test")
    query_mask = torch.rand(1, 1, 8, 16, generator=torch.Generator().manual_seed(0)) > 0.3
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = dispatch_attention_fn(q, k, v, attn_mask=query_mask, backend=name)
        dispatch_attention_fn(q, k, v, attn_mask=torch.zeros(1, 1, 1, 16), backend=name)  # float
    ref = dispatch_attention_fn(q, k, v, attn_mask=query_mask, backend=AttentionBackendName.NATIVE)
    assert torch.equal(out, ref)
    assert varlen_backend_stats(name)["fallback_reasons"] == {"varlen_mask": 2}
    assert sum("dense 'mxattention' backend" in str(w.message) for w in rec) == 1
    register_diffusers_varlen_backend("mxattention", name=name, strict=True)
    with pytest.raises(mxattention.FallbackError, match="key-padding"):
        dispatch_attention_fn(q, k, v, attn_mask=query_mask, backend=name)


def test_backward_raises_inference_only():
    q, k, v = _bshd(1, 8, 2, 32, 0), _bshd(1, 16, 2, 32, 1), _bshd(1, 16, 2, 32, 2)
    out = dispatch_attention_fn(q.requires_grad_(True), k, v, backend="mxattention_varlen")
    with pytest.raises(mxattention.InferenceOnlyError):
        out.sum().backward()


def test_hunyuan_video_with_its_text_mask():
    # HunyuanVideo's bool [B, 1, 1, N] mask (the last text tokens padding): served without copies.
    model = tiny_models.hunyuan()
    inputs = tiny_models.hunyuan_inputs()
    with torch.no_grad():
        native = model(**inputs)[0]
        reset_varlen_backend_stats("mxattention_fp_varlen")
        with attention_backend("mxattention_fp_varlen"):
            fp = model(**inputs)[0]
        with attention_backend("mxattention_varlen"):
            mx = model(**inputs)[0]
    assert rel_l2(fp, native) <= 1e-5
    assert 0 < rel_l2(mx, native) < 0.1
    stats = varlen_backend_stats("mxattention_fp_varlen")
    assert stats["routed"] == 2 and stats["fallback"] == 0


def test_compiles_without_graph_breaks():
    q, k, v = _bshd(2, 8, 2, 32, 0), _bshd(2, 16, 2, 32, 1), _bshd(2, 16, 2, 32, 2)
    mask = torch.arange(16)[None, :] < torch.tensor([[16], [9]])

    def f(q, k, v, mask):
        return dispatch_attention_fn(q, k, v, attn_mask=mask, backend="mxattention_varlen")

    torch._dynamo.reset()
    out = torch.compile(f, backend="aot_eager", fullgraph=True)(q, k, v, mask)
    assert torch.equal(out, f(q, k, v, mask))


@pytest.mark.parametrize("name", ["Upper", "-lead", "with space", 3])
def test_backend_name_checked_as_the_dense_backend(name):
    # Both backends take one name check (diffusers lower-cases names): a bad one is refused up front.
    with pytest.raises(ValueError, match="lower case letters"):
        register_diffusers_varlen_backend(name=name)
