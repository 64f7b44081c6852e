"""A call like one the kernels served before replays that call's program (`ops.memo`), skipping the
checks, the routing and the plan, and only such a call: anything its signature holds that differs
(layout, dtype, alignment, scalars, mask, method, the CPU-kernels switch, tracked gradients) takes
the normal path. Run on Triton's interpreter (CPU tensors through the kernels)."""

from __future__ import annotations

import warnings

import pytest
import torch

import mxattention
from mxattention.kernels import builds, program
from mxattention.kernels import plan as kplan
from mxattention.kernels._triton import HAS_TRITON, kernels_interpreted
from mxattention.kernels.plan import CPU_KERNELS_ENV
from mxattention.ops import call, entry

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="programs replay Triton launches")
# CPU tensors run the kernels only on Triton's interpreter (on a GPU machine they take the reference).
INTERPRETED = pytest.mark.skipif(not kernels_interpreted(), reason="CPU tensors' kernels: the interpreter")
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="direct replays need a GPU")
BF16 = torch.bfloat16
SHAPE = (1, 2, 40, 32)


@pytest.fixture(autouse=True)
def _kernels(monkeypatch):
    monkeypatch.setattr(kplan, "_PLANS", {})
    monkeypatch.setattr(builds, "FAILURES", {})
    monkeypatch.setenv(CPU_KERNELS_ENV, "1")
    monkeypatch.delenv(program.PROGRAMS_ENV, raising=False)


def _hostile(shape, dtype=BF16, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g) * torch.exp(2 * torch.randn(shape[-1], generator=g))
    x.view(-1)[::31] = 0.0
    x.view(-1)[3] = 3e4
    return x.to(dtype)


def _qkv(seed, shape=SHAPE, dtype=BF16):
    return [_hostile(shape, dtype, seed + i) for i in range(3)]


def _outcome(fn):
    """(O, lse) of `fn()`, or the exception it raised as (type, message)."""
    try:
        return fn()
    except Exception as e:  # the outcome compared is the exception itself
        return type(e), str(e)


def _fresh(monkeypatch, fn):
    """`fn()`'s outcome on the normal path: no plan, no memo, no program."""
    saved = dict(kplan._PLANS)
    monkeypatch.setenv(program.PROGRAMS_ENV, "0")
    kplan._PLANS.clear()
    try:
        return _outcome(fn)
    finally:
        monkeypatch.delenv(program.PROGRAMS_ENV)
        kplan._PLANS.clear()
        kplan._PLANS.update(saved)


def _same(got, want):
    if isinstance(want, tuple) and isinstance(want[0], type):
        assert got == want
        return
    assert isinstance(got, tuple) and not isinstance(got[0], type), got
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


@pytest.fixture
def counts(monkeypatch):
    """Calls of the entry's checks and of the plan's run, and program replays, from now on."""
    seen = {"checks": 0, "dense": 0, "replays": 0}

    def counted(name, owner, attr):
        real = getattr(owner, attr)

        def wrapper(*a, **kw):
            seen[name] += 1
            return real(*a, **kw)

        monkeypatch.setattr(owner, attr, wrapper)

    counted("checks", entry, "check_sdpa")
    counted("dense", entry, "dense")
    counted("dense", call, "dense")
    counted("replays", program.CallProgram, "run")
    return seen


@INTERPRETED
def test_a_call_like_one_served_before_replays_its_program(monkeypatch, counts):
    mxattention.scaled_dot_product_attention(*_qkv(0))
    assert counts == {"checks": 1, "dense": 1, "replays": 0}
    second = _qkv(10)
    second[1].view(-1)[7] = float("nan")
    got = mxattention.scaled_dot_product_attention(*second, return_lse=True)
    assert counts == {"checks": 1, "dense": 1, "replays": 1}  # no check, no plan: the program
    _same(
        got, _fresh(monkeypatch, lambda: mxattention.scaled_dot_product_attention(*second, return_lse=True))
    )


def _transposed(t):
    return t.transpose(1, 2).contiguous().transpose(1, 2)  # [B, H, L, D] of a [B, L, H, D] buffer


def _shifted(t):
    big = torch.empty(t.numel() + 1, dtype=t.dtype)  # one element further: 2 bytes off 16-byte alignment
    out = big[1:].view(t.shape)
    out.copy_(t)
    return out


MASK = torch.rand(1, 1, SHAPE[2], SHAPE[2]) > 0.3
# (arguments of the recorded call, arguments of the call that must not replay it): each differs from
# the recorded call in one part of the signature.
VARIANTS = {
    "layout": ({}, {"qkv": lambda q, k, v: [_transposed(q), k, v]}),
    "dtype": ({}, {"qkv": lambda q, k, v: [t.float() for t in (q, k, v)]}),
    "alignment": ({}, {"qkv": lambda q, k, v: [q, _shifted(k), v]}),
    "scale": ({}, {"scale": 0.25}),
    "scale_type": ({"scale": 1}, {"scale": True}),
    "causal": ({}, {"is_causal": True}),
    "mask": ({}, {"attn_mask": MASK}),
    "mask_dtype": ({"attn_mask": MASK}, {"attn_mask": MASK.float()}),
    "dropout": ({}, {"dropout_p": 0.5}),
    "method": ({}, {"method": "mxattention-pv8"}),
    "gqa_keys": ({}, {"qkv": lambda q, k, v: [q, k[:, :1], v[:, :1]]}),
}


@INTERPRETED
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_call_that_differs_in_its_signature_takes_the_normal_path(monkeypatch, counts, variant):
    recorded, other = VARIANTS[variant]
    mxattention.scaled_dot_product_attention(*_qkv(0), **recorded)
    assert counts["replays"] == 0
    qkv = _qkv(10)
    kw = dict(other)
    qkv = kw.pop("qkv", lambda *t: list(t))(*qkv)
    got = _outcome(lambda: mxattention.scaled_dot_product_attention(*qkv, return_lse=True, **kw))
    assert counts["checks"] == 2 and counts["replays"] == 0
    _same(
        got,
        _fresh(monkeypatch, lambda: mxattention.scaled_dot_product_attention(*qkv, return_lse=True, **kw)),
    )


@INTERPRETED
def test_the_cpu_kernels_switch_is_read_at_every_call(monkeypatch, counts):
    q, k, v = _qkv(0)
    mxattention.scaled_dot_product_attention(q, k, v)
    monkeypatch.setenv(CPU_KERNELS_ENV, "0")  # CPU tensors: the reference (warned once per process)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mxattention.ReferenceFallbackWarning)
        got = mxattention.scaled_dot_product_attention(q, k, v, return_lse=True)
        assert (counts["checks"], counts["replays"]) == (2, 0)
        _same(
            got,
            _fresh(monkeypatch, lambda: mxattention.scaled_dot_product_attention(q, k, v, return_lse=True)),
        )


@INTERPRETED
def test_tracked_gradients_never_replay(counts):
    q, k, v = _qkv(0)
    mxattention.scaled_dot_product_attention(q, k, v)
    q.requires_grad_(True)
    out = mxattention.scaled_dot_product_attention(q, k, v)
    assert counts["checks"] == 2  # checked, and through the op that autograd records
    with pytest.raises(mxattention.InferenceOnlyError):
        out.float().sum().backward()
    with torch.no_grad():  # nothing to record: the memo serves it
        mxattention.scaled_dot_product_attention(q, k, v)
    assert counts["checks"] == 2


@INTERPRETED
def test_diffusers_calls_replay_decided_and_counted(monkeypatch, counts):
    """Hits of the diffusers backend are routed by the policy and counted like every call: a call
    the policy keeps in high precision runs it, whatever the memo holds."""
    pytest.importorskip("diffusers")
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    from mxattention.integrations import PrecisionPolicy, backend_stats, register_diffusers_backend

    policy = PrecisionPolicy(steps={1})
    name = register_diffusers_backend("mxattention", name="mxattention_memo_test", policy=policy)
    layout = (SHAPE[0], SHAPE[2], SHAPE[1], SHAPE[3])  # diffusers' [B, S, H, D]
    policy._state.on_model_call(1.0)  # step 0: quantized
    dispatch_attention_fn(*_qkv(0, layout), backend=name)
    second = _qkv(10, layout)
    got = dispatch_attention_fn(*second, backend=name)
    assert counts["replays"] == 1 and counts["dense"] == 1
    want = _fresh(
        monkeypatch, lambda: mxattention.scaled_dot_product_attention(*(t.transpose(1, 2) for t in second))
    )
    assert torch.equal(got, want.transpose(1, 2))
    policy._state.on_model_call(0.5)  # step 1: kept in high precision (torch's SDPA), the same signature
    third = _qkv(20, layout)
    got = dispatch_attention_fn(*third, backend=name)
    assert counts["replays"] == 1
    native = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in third))
    assert torch.equal(got, native.transpose(1, 2))
    stats = backend_stats(name)
    assert (stats["routed"], stats["high_precision"]) == (2, 1)


@CUDA
def test_gpu_hits_replay_directly_in_either_layout(monkeypatch, counts):
    """On the GPU the memo's programs launch directly; the diffusers backend's hits take its
    [B, S, H, D] tensors as they come (the addresses of the permuted views the plan was made for)."""
    pytest.importorskip("diffusers")
    from diffusers.models.attention_dispatch import dispatch_attention_fn

    from mxattention.integrations import register_diffusers_backend

    shape = (1, 3, 300, 128)
    cuda = [[t.cuda() for t in _qkv(s, shape)] for s in (0, 10)]
    mxattention.scaled_dot_product_attention(*cuda[0])
    got = mxattention.scaled_dot_product_attention(*cuda[1], return_lse=True)
    assert (counts["checks"], counts["replays"]) == (1, 1)
    _same(
        got, _fresh(monkeypatch, lambda: mxattention.scaled_dot_product_attention(*cuda[1], return_lse=True))
    )
    # Again at the same addresses (the descriptors' expansions reused), then at the first inputs'.
    _same(mxattention.scaled_dot_product_attention(*cuda[1], return_lse=True), got)
    first = mxattention.scaled_dot_product_attention(*cuda[0], return_lse=True)
    _same(
        first,
        _fresh(monkeypatch, lambda: mxattention.scaled_dot_product_attention(*cuda[0], return_lse=True)),
    )
    assert counts["replays"] == 3
    name = register_diffusers_backend("mxattention", name="mxattention_memo_gpu")
    bshd = [[t.transpose(1, 2).contiguous() for t in qkv] for qkv in cuda]
    dispatch_attention_fn(*bshd[0], backend=name)
    replays = counts["replays"]
    got = dispatch_attention_fn(*bshd[1], backend=name)
    assert counts["replays"] == replays + 1
    want = _fresh(
        monkeypatch, lambda: mxattention.scaled_dot_product_attention(*(t.transpose(1, 2) for t in bshd[1]))
    )
    assert torch.equal(got, want.transpose(1, 2))


@INTERPRETED
def test_patched_sdpa_calls_replay_counted(monkeypatch, counts):
    F = torch.nn.functional
    with mxattention.patch_sdpa("mxattention") as patch:
        F.scaled_dot_product_attention(*_qkv(0))
        second = _qkv(10)
        got = F.scaled_dot_product_attention(*second)
    assert counts["replays"] == 1 and counts["dense"] == 1
    assert patch.stats()["routed"] == 2
    want = _fresh(monkeypatch, lambda: mxattention.scaled_dot_product_attention(*second))
    assert torch.equal(got, want)
