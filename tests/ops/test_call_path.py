"""The path of one diffusers call to its launch is short (issue 28: at most 6 calls, one custom op).

Counted with `sys.setprofile` on a CPU call that runs the kernels on Triton's interpreter: every call
into a mxattention function made on the way from the registered backend function to the launch
entry `kernels.fused.run_plan`, i.e. the functions on the stack when run_plan starts (the path) and
every call those made and that returned before (checks, decisions, the plan's look-up). What a
called helper does inside is its own business and not counted; generator expressions are not calls.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("diffusers")
from diffusers.models.attention_dispatch import dispatch_attention_fn

import mxattention
from mxattention.integrations import register_diffusers_backend
from mxattention.kernels import fused

SRC = str(Path(mxattention.__file__).resolve().parent)
MAX_CALLS = 6


class _Reached(Exception):
    """Raised at run_plan's entry: what follows is the launch's business (and interpreter time)."""


def _path_calls(fn) -> list[str]:
    """The mxattention calls (qualified names) on the way from the backend function to run_plan."""
    parents: dict[object, object] = {}  # frame -> its nearest mxattention caller frame (or None)
    names: dict[object, str] = {}
    order: list[object] = []
    found: list[object] = []

    def mx_caller(frame):
        f = frame.f_back
        while f is not None and f not in names:
            f = f.f_back
        return f

    def prof(frame, event, arg):
        if event != "call" or found:
            return
        code = frame.f_code
        if not code.co_filename.startswith(SRC) or code.co_name.startswith("<"):
            return
        parents[frame] = mx_caller(frame)
        names[frame] = code.co_qualname
        order.append(frame)
        if code is fused.run_plan.__code__:
            found.append(frame)
            raise _Reached  # a profile function's exception ends profiling and propagates

    sys.setprofile(prof)
    try:
        fn()
    except _Reached:
        pass
    finally:
        sys.setprofile(None)
    assert found, "run_plan was not reached: the call did not run the kernels"
    path = [found[0]]
    while parents[path[-1]] is not None:
        path.append(parents[path[-1]])
    root = path[-1]
    assert names[root].startswith("_backend_fn.<locals>.mxattention"), names[root]
    on_path = set(path)
    return [names[f] for f in order if f is not root and parents[f] in on_path]


@pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the CPU call runs the kernels on the interpreter"
)
def test_diffusers_call_reaches_run_plan_in_at_most_six_calls(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("MXATTENTION_CPU_KERNELS", "1")
    name = register_diffusers_backend("mxattention", name="mxattention_call_path")
    q, k, v = (torch.randn(1, 32, 2, 32) for _ in range(3))
    # A first call (imports, the plan made) counts alike: what a helper does inside is not counted.
    calls = _path_calls(lambda: dispatch_attention_fn(q, k, v, backend=name))
    assert len(calls) <= MAX_CALLS, " -> ".join(calls)
