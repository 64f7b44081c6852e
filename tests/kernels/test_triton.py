"""`_triton.kernels_interpreted` answers what Triton made of this process's kernels."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from mxattention.kernels._triton import HAS_TRITON, kernels_interpreted

pytestmark = pytest.mark.skipif(not HAS_TRITON, reason="needs Triton")

_ASK = (
    "from triton.runtime.interpreter import InterpretedFunction as F;"
    "from mxattention.kernels import attention_fwd as a, prepass as p;"
    "from mxattention.kernels._triton import kernels_interpreted as k;"
    "print(k(), isinstance(a._mx_attention_fwd_kernel, F), isinstance(p._v_prepass_kernel, F))"
)


def test_agrees_with_the_kernels_in_this_process():
    from triton.runtime.interpreter import InterpretedFunction

    from mxattention.kernels import attention_fwd

    assert kernels_interpreted() is isinstance(attention_fwd._mx_attention_fwd_kernel, InterpretedFunction)


@pytest.mark.parametrize("interpret", [True, False])
def test_follows_triton_interpret_at_import(interpret):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    out = subprocess.run([sys.executable, "-c", _ASK], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(interpret)] * 3, out.stdout + out.stderr
