"""patch_sdpa / enable / disable: torch.nn.functional.scaled_dot_product_attention routed and restored."""

import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mxattention
from mxattention.integrations import PrecisionPolicy, disable, enable, patch_sdpa, stats
from tests.integrations.tiny_models import rel_l2

ORIGINAL = F.scaled_dot_product_attention


class SelfAttentionBlock(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(dim, 3 * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = (t.unflatten(-1, (self.heads, -1)).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        o = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training else 0.0)
        return x + o.transpose(1, 2).flatten(2)


class TinyAttentionModel(nn.Module):
    """Two self-attention blocks that call F.scaled_dot_product_attention at call time."""

    def __init__(self, dim: int = 64, heads: int = 2, dropout: float = 0.0) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(SelfAttentionBlock(dim, heads, dropout) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


@pytest.fixture
def model_and_input():
    torch.manual_seed(0)
    return TinyAttentionModel().eval(), torch.randn(2, 96, 64)


@pytest.fixture(autouse=True)
def _restored():
    yield
    assert F.scaled_dot_product_attention is ORIGINAL, "a test left torch's SDPA patched"


def test_fp_equals_and_mx_changes_the_model(model_and_input):
    model, x = model_and_input
    with torch.no_grad():
        ref = model(x)
        with patch_sdpa("fp") as fp_patch:
            fp = model(x)
        with patch_sdpa() as mx_patch:
            assert F.scaled_dot_product_attention is not ORIGINAL
            mx = model(x)
    assert rel_l2(fp, ref) <= 1e-6
    assert 0 < rel_l2(mx, ref) < 0.1
    assert fp_patch.stats()["routed"] == mx_patch.stats()["routed"] == 2
    assert mx_patch.stats()["fallback"] == 0 and mx_patch.method.name == "mxattention"


def test_unsupported_calls_fall_back_counted_by_reason():
    torch.manual_seed(0)
    model, x = TinyAttentionModel(dropout=0.1).train(), torch.randn(2, 96, 64)
    q, k, v = torch.randn(3, 1, 2, 32, 16).unbind(0)
    with torch.no_grad():
        torch.manual_seed(1)
        ref = model(x)
        with patch_sdpa() as patch:
            torch.manual_seed(1)
            out = model(x)  # dropout in training
            F.scaled_dot_product_attention(q[0], k[0], v[0])  # 3-D: valid for torch, not for us
            F.scaled_dot_product_attention(q.double(), k.double(), v.double())
            for bad in ({"attn_mask": torch.ones(32, 32, dtype=torch.int8)}, {"key": k[..., :8]}):
                with pytest.raises(RuntimeError):  # invalid calls: torch raises its own error
                    F.scaled_dot_product_attention(**{"query": q, "key": k, "value": v, **bad})
            F.scaled_dot_product_attention(q, k, v)
    assert torch.equal(out, ref)
    s = patch.stats()
    assert s["fallback_reasons"] == {"dropout": 2, "ndim": 1, "dtype": 1, "mask": 1, "shape": 1}
    assert s["fallback"] == 6 and s["routed"] == 1


class TrainableModel(nn.Module):
    """The README's module: three attention blocks whose parameters require grad."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.blocks = nn.ModuleList(SelfAttentionBlock(64, 2, 0.0) for _ in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_calls_tracking_gradients_are_quantized_and_backward_raises():
    model, x = TrainableModel(), torch.randn(1, 64, 64)
    assert all(p.requires_grad for p in model.parameters())
    with torch.no_grad(), patch_sdpa():
        want = model(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # quantized: no fallback, so no warning
        with patch_sdpa() as patch:  # the README's snippet, without torch.no_grad()
            out = model(x)
    assert patch.stats()["routed"] == 3 and patch.stats()["fallback"] == 0
    assert torch.equal(out, want) and out.requires_grad  # same numerics with or without grad mode
    with pytest.raises(mxattention.InferenceOnlyError, match="inference-only") as err:
        out.sum().backward()
    assert "autograd='torch'" in str(err.value)


def test_autograd_torch_runs_torch_sdpa_for_calls_tracking_gradients():
    model, x = TrainableModel(), torch.randn(1, 64, 64)
    want = model(x)
    want.sum().backward()
    want_grad = model.blocks[0].qkv.weight.grad.clone()
    model.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # chosen, so not warned (nor refused by strict)
        with patch_sdpa(autograd="torch", strict=True) as patch:
            out = model(x)
            with torch.no_grad():
                quantized = model(x)
    out.sum().backward()
    assert torch.equal(out, want) and torch.equal(model.blocks[0].qkv.weight.grad, want_grad)
    assert patch.stats()["fallback_reasons"] == {"autograd": 3} and patch.stats()["routed"] == 3
    assert not torch.equal(quantized, want)
    with pytest.raises(ValueError, match="autograd"):
        patch_sdpa(autograd="ste")
    with pytest.raises(TypeError, match="strict"):
        enable(strict=1)


def test_fallback_warns_once_per_reason_at_the_callers_line():
    q, k, v = torch.randn(3, 1, 2, 32, 16).unbind(0)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        with patch_sdpa() as patch:
            for _ in range(2):
                F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
                F.scaled_dot_product_attention(q.double(), k.double(), v.double())
        with patch_sdpa():
            F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)  # a new patch warns again
    assert patch.stats()["fallback_reasons"] == {"dropout": 2, "dtype": 2}
    msgs = [w for w in rec if issubclass(w.category, mxattention.FallbackWarning)]
    assert len(msgs) == 3
    assert "'dropout'" in str(msgs[0].message) and "model.eval()" in str(msgs[0].message)
    assert "'dtype'" in str(msgs[1].message) and "cast" in str(msgs[1].message)
    assert {w.filename for w in msgs} == {__file__}


def test_strict_raises_instead_of_falling_back(model_and_input):
    model, x = model_and_input
    q, k, v = torch.randn(3, 1, 2, 32, 16).unbind(0)
    with patch_sdpa(strict=True) as patch, torch.no_grad():
        model(x)  # served calls run as usual
        with pytest.raises(mxattention.FallbackError, match="'dtype'"):
            F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    assert patch.stats()["routed"] == 2 and patch.stats()["fallback"] == 0
    enable(strict=True)
    try:
        with pytest.raises(mxattention.FallbackError, match="mxattention.enable"):
            F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)
    finally:
        disable()


def test_original_restored_after_exceptions_and_reuse():
    patch = patch_sdpa("fp")
    with pytest.raises(KeyError), patch:
        raise KeyError("boom")
    assert F.scaled_dot_product_attention is ORIGINAL and not patch.active
    with patch:
        assert patch.active
    with pytest.raises(RuntimeError, match="already installed"), patch, patch:
        pass


def test_nesting_restores_each_level_and_counts_the_innermost():
    q, k, v = torch.randn(3, 1, 2, 64, 32).unbind(0)
    with patch_sdpa("fp") as outer:
        fn_outer = F.scaled_dot_product_attention
        F.scaled_dot_product_attention(q, k, v)
        with patch_sdpa("mxfp4-ocp") as inner:
            F.scaled_dot_product_attention(q, k, v)
            F.scaled_dot_product_attention(q, k, v)
        assert F.scaled_dot_product_attention is fn_outer
        F.scaled_dot_product_attention(q, k, v)
    assert outer.stats()["routed"] == 2 and inner.stats()["routed"] == 2


def test_out_of_order_exit_passes_through_then_unwinds():
    q, k, v = torch.randn(3, 1, 2, 64, 32).unbind(0)
    outer, inner = patch_sdpa("fp"), patch_sdpa("mxfp4-ocp")
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # left before the inner one: stays installed, inactive
    assert F.scaled_dot_product_attention is not ORIGINAL
    F.scaled_dot_product_attention(q, k, v)
    inner.__exit__(None, None, None)
    assert F.scaled_dot_product_attention is ORIGINAL
    assert inner.stats()["routed"] == 1 and outer.stats()["routed"] == 0


def test_enable_disable_and_module_stats():
    q, k, v = torch.randn(3, 1, 2, 64, 32).unbind(0)
    stats(reset=True)
    first = mxattention.enable("fp")
    second = enable()
    F.scaled_dot_product_attention(q, k, v)
    assert disable()["routed"] == 1 and not second.active and first.active
    F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert mxattention.disable() == first.stats()
    assert F.scaled_dot_product_attention is ORIGINAL
    with pytest.raises(RuntimeError, match="no patch enabled"):
        disable()
    total = stats()
    assert total["routed"] == 1 and total["fallback_reasons"] == {"dropout": 1}


def test_policy_keeps_calls_native_or_fp(model_and_input):
    model, x = model_and_input
    keep_all = PrecisionPolicy(kinds={"self", "cross"})
    keep_second = PrecisionPolicy(layers={1})
    keep_all_fp = PrecisionPolicy(kinds={"self"}, high_precision="fp")
    with torch.no_grad():
        ref = model(x)
        with patch_sdpa(policy=keep_all) as patch:
            native = model(x)
        with patch_sdpa("fp"):
            fp = model(x)
        with patch_sdpa(policy=keep_all_fp):
            kept_fp = model(x)
        with keep_second.attach(model), patch_sdpa(policy=keep_second) as half:
            mixed = model(x)
    assert torch.equal(native, ref) and torch.equal(kept_fp, fp)
    assert patch.stats()["high_precision"] == 2 and patch.stats()["routed"] == 0
    assert half.stats()["high_precision"] == 1 and half.stats()["routed"] == 1
    assert keep_second.counts()["by_layer"] == {
        0: {"quantized": 1, "high_precision": 0},
        1: {"quantized": 0, "high_precision": 1},
    }
    assert 0 < rel_l2(mixed, ref)


def test_diffusers_native_backend_is_routed():
    pytest.importorskip("diffusers")
    from diffusers.models.attention_dispatch import attention_backend

    from tests.integrations import tiny_models

    model, inputs = tiny_models.wan(), tiny_models.wan_inputs()
    with torch.no_grad(), attention_backend("native"):
        ref = model(**inputs)[0]
        with patch_sdpa("fp") as fp_patch:
            fp = model(**inputs)[0]
        with patch_sdpa() as mx_patch:
            mx = model(**inputs)[0]
    assert fp_patch.stats()["routed"] == mx_patch.stats()["routed"] == 4
    assert rel_l2(fp, ref) <= 1e-5 and 0 < rel_l2(mx, ref) < 0.1


def test_patch_is_process_wide():
    q, k, v = torch.randn(3, 1, 2, 64, 32).unbind(0)
    with patch_sdpa("fp") as patch:
        worker = threading.Thread(target=F.scaled_dot_product_attention, args=(q, k, v))
        worker.start()
        worker.join()
    assert patch.stats()["routed"] == 1
