"""The public dense entry runs its custom op's body directly in plain eager calls (host time), and the
op wherever the op matters: autograd to record (its backward raises), a dispatch mode (fake tensors,
counters), tensor subclasses, torch.compile. Both give the same result."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import mxattention
from mxattention.ops import entry


class _Passthrough(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


@pytest.fixture
def op_calls(monkeypatch):
    calls = []
    real = entry.sdpa_op
    monkeypatch.setattr(entry, "sdpa_op", lambda *a: calls.append(1) or real(*a))
    return calls


def _qkv(**kw):
    return [torch.randn(1, 2, 24, 32, **kw) for _ in range(3)]


def test_plain_eager_calls_skip_the_dispatcher(op_calls):
    q, k, v = _qkv()
    direct = mxattention.scaled_dot_product_attention(q, k, v, method="fp", return_lse=True)
    assert op_calls == []
    with torch.no_grad():
        q.requires_grad_(True)
        mxattention.scaled_dot_product_attention(q, k, v, method="fp")
    assert op_calls == []  # nothing to record without grad mode
    q.requires_grad_(False)
    with _Passthrough():
        through = mxattention.scaled_dot_product_attention(q, k, v, method="fp", return_lse=True)
    assert op_calls == [1]
    assert torch.equal(direct[0], through[0]) and torch.equal(direct[1], through[1])


def test_autograd_goes_through_the_op(op_calls):
    q, k, v = _qkv()
    q.requires_grad_(True)
    out = mxattention.scaled_dot_product_attention(q, k, v, method="fp")
    assert op_calls == [1]
    with pytest.raises(mxattention.InferenceOnlyError):
        out.sum().backward()


def test_subclasses_go_through_the_op(op_calls):
    class Sub(torch.Tensor):
        pass

    q, k, v = (t.as_subclass(Sub) for t in _qkv())
    mxattention.scaled_dot_product_attention(q, k, v, method="fp")
    assert op_calls == [1]
