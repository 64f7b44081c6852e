"""The call's one home (`mxattention.ops`): one validator, one table of reasons, interned method keys,
and no custom op running inside another."""

from __future__ import annotations

import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import mxattention as mx
from mxattention.attention.inputs import REASON_NAMES, sdpa_problem
from mxattention.attention.keys import config_from_key, method_key
from mxattention.ops import REASONS, call, route

Q = (1, 2, 8, 32)


def _bad_calls():
    q, k, v = (torch.randn(Q) for _ in range(3))
    ok = {"query": q, "key": k, "value": v}
    return [
        ("tensor_type", TypeError, "key must be a torch.Tensor", {**ok, "key": k.numpy()}),
        ("dtype", TypeError, "query must be float32, float16 or bfloat16", {**ok, "query": q.long()}),
        ("ndim", ValueError, "query must be 4-D", {**ok, "query": q[0]}),
        ("dtype", TypeError, "share one dtype", {**ok, "key": k.half()}),
        ("device", ValueError, "one device", {**ok, "key": k.to("meta")}),
        ("dropout", ValueError, "dropout_p must be 0", {**ok, "dropout_p": 0.1}),
        ("scale", TypeError, "scale must be a float or None, got str", {**ok, "scale": "0.1"}),
        ("scale", TypeError, "scale must be a float or None, got bool", {**ok, "scale": True}),
        ("shape", ValueError, "batch sizes differ", {**ok, "key": torch.randn(2, 2, 8, 32)}),
        ("shape", ValueError, "enable_gqa=True", {**ok, "key": torch.randn(1, 1, 8, 32), "value": v[:, :1]}),
        (
            "mask",
            ValueError,
            "not both",
            {**ok, "attn_mask": torch.ones(8, 8, dtype=torch.bool), "is_causal": True},
        ),
        (
            "mask",
            TypeError,
            "attn_mask must be bool",
            {**ok, "attn_mask": torch.ones(8, 8, dtype=torch.int32)},
        ),
        ("mask", ValueError, "does not broadcast", {**ok, "attn_mask": torch.ones(3, 8, dtype=torch.bool)}),
        (
            "mask",
            ValueError,
            "at most 4 dims",
            {**ok, "attn_mask": torch.ones(1, 1, 1, 8, 8, dtype=torch.bool)},
        ),
    ]


@pytest.mark.parametrize("case", range(len(_bad_calls())))
def test_one_validator_gives_the_entry_error_and_the_fallback_reason(case):
    reason, exc, match, kw = _bad_calls()[case]
    args = (kw["query"], kw["key"], kw["value"], kw.get("attn_mask"), kw.get("dropout_p", 0.0))
    rest = (kw.get("is_causal", False), kw.get("scale"), kw.get("enable_gqa", False))
    assert sdpa_problem(*args, *rest) == reason and reason in REASONS
    with pytest.raises(exc, match=match):
        sdpa_problem(*args, *rest, raises=True)
    with pytest.raises(exc, match=match):
        mx.scaled_dot_product_attention(**kw)


def test_reason_table_explains_every_reason():
    assert set(REASON_NAMES) <= set(REASONS)
    assert all(what and fix for what, fix in REASONS.values())


def test_zero_size_is_neither_an_error_nor_a_reason():
    for shapes in [((0, 2, 8, 32),) * 3, ((1, 2, 8, 32), (1, 2, 0, 32), (1, 2, 0, 32)), ((1, 2, 8, 0),) * 3]:
        q, k, v = (torch.randn(s) for s in shapes)
        assert sdpa_problem(q, k, v, None, 0.0, False, None, False, raises=True) is None


def test_method_key_is_interned_and_short():
    cfg = mx.get_method("mxattention")
    assert method_key(cfg) == "mxattention" and config_from_key("mxattention") is cfg
    custom = cfg.with_tiles(block_n=64)
    key = method_key(custom)
    assert key is method_key(custom.with_tiles(block_n=64))  # equal configs: the same object
    assert key.startswith("mxattention#") and "{" not in key and len(key) < 20
    assert config_from_key(key) is custom
    assert method_key(cfg.with_tiles(block_n=128)) != key
    with pytest.raises(ValueError, match="unknown method"):
        config_from_key("no-such-method")


def _op_bodies() -> set:
    from mxattention.integrations import policy

    ops = (call.sdpa_op, call.routed_sdpa, call.varlen_op, call.no_backward, route.route_decide)
    return {op._init_fn.__code__ for op in (*ops, route.route_fallback, policy._model_call_op)}


def _deepest_op_nesting(fn) -> int:
    """The most custom-op bodies (of mxattention's ops) on the stack at once while `fn` runs."""
    bodies, depth, deepest = _op_bodies(), [0], [0]

    def prof(frame, event, arg):
        if frame.f_code in bodies:
            if event == "call":
                depth[0] += 1
                deepest[0] = max(deepest[0], depth[0])
            elif event == "return":
                depth[0] -= 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return deepest[0]


def test_no_custom_op_runs_inside_another():
    """Each entry makes one op call and no op calls another; a plain eager dense call runs the op's
    body without the op (`ops.memo.plain_eager`: 0 op bodies on the stack), one with autograd to
    record takes the op (1)."""
    q, k, v = (torch.randn(1, 2, 40, 32) for _ in range(3))
    qg = q.clone().requires_grad_(True)
    cu = torch.tensor([0, 15, 40], dtype=torch.int32)
    packed = q[0].transpose(0, 1).contiguous()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mx.ReferenceFallbackWarning)
        for query, depth in ((q, 0), (qg, 1)):
            assert (
                _deepest_op_nesting(lambda query=query: mx.scaled_dot_product_attention(query, k, v)) == depth
            )
            with mx.patch_sdpa("mxattention"):
                assert (
                    _deepest_op_nesting(lambda query=query: F.scaled_dot_product_attention(query, k, v))
                    == depth
                )
        assert _deepest_op_nesting(lambda: mx.varlen_attention(packed, packed, packed, cu, cu)) == 1
        pytest.importorskip("diffusers")
        from diffusers.models.attention_dispatch import dispatch_attention_fn

        from mxattention.integrations import register_diffusers_backend, register_diffusers_varlen_backend

        dense, varlen = register_diffusers_backend(), register_diffusers_varlen_backend()
        mask = torch.arange(40)[None, :] < 30
        for name, query, depth in ((dense, q, 0), (dense, qg, 1), (varlen, q, 1)):
            x = query.transpose(1, 2)
            got = _deepest_op_nesting(
                lambda name=name, x=x: dispatch_attention_fn(
                    x, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask, backend=name
                )
            )
            assert got == depth, (name, depth)
