"""The path of one diffusers call to its launch is short (issue 28: at most 6 calls, one custom op).

Counted with `sys.setprofile` on a CPU call that runs the kernels on Triton's interpreter: every call
into a mxattention function made on the way from the registered backend function to the launch
entry, i.e. the functions on the stack when that entry starts (the path) and every call those made
and that returned before (checks, decisions, look-ups). What a called helper does inside is its own
business and not counted; generator expressions are not calls. The launch entry of a call like one
served before is its program's replay (`kernels.program.CallProgram.run`, through `ops.memo`); of
a first call, the plan's run (`kernels.fused.run_plan`), two calls further (the memo's signature
and look-up come first).
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
from mxattention.kernels import fused, program

SRC = str(Path(mxattention.__file__).resolve().parent)
MAX_CALLS = 6  # a call like one served before, to its program's replay
MAX_FIRST_CALLS = 8  # the first call of a signature, to the plan's run


class _Reached(Exception):
    """Raised at run_plan's entry: what follows is the launch's business (and interpreter time)."""


def _path_calls(fn, launch=fused.run_plan) -> list[str]:
    """The mxattention calls (qualified names) on the way from the backend function to `launch`."""
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
        if code is launch.__code__:
            found.append(frame)
            raise _Reached  # a profile function's exception ends profiling and propagates

    sys.setprofile(prof)
    try:
        fn()
    except _Reached:
        pass
    finally:
        sys.setprofile(None)
    assert found, f"{launch.__qualname__} was not reached: the call did not run the kernels"
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
def test_diffusers_call_reaches_its_launch_in_at_most_six_calls(monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("MXATTENTION_CPU_KERNELS", "1")
    name = register_diffusers_backend("mxattention", name="mxattention_call_path")
    q, k, v = (torch.randn(1, 32, 2, 32) for _ in range(3))
    # A first call (imports, the plan made) counts alike: what a helper does inside is not counted.
    calls = _path_calls(lambda: dispatch_attention_fn(q, k, v, backend=name))
    assert len(calls) <= MAX_FIRST_CALLS, " -> ".join(calls)
    dispatch_attention_fn(q, k, v, backend=name)  # the whole call (the count stopped the first): recorded
    # A model's next calls: fresh tensors of the same layout replay the program the first recorded.
    q, k, v = (torch.randn(1, 32, 2, 32) for _ in range(3))
    calls = _path_calls(lambda: dispatch_attention_fn(q, k, v, backend=name), program.CallProgram.run)
    assert "run_plan" not in calls and len(calls) <= MAX_CALLS, " -> ".join(calls)
