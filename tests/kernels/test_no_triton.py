"""The package without Triton (`pip install mxattention`, no `gpu` extra): it imports, every preset
computes on the CPU through the PyTorch reference, and the CLI answers. Triton is installed in the
test environment, so the child process blocks its import."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import importlib.abc
    import sys


    class BlockTriton(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "triton" or name.startswith("triton."):
                raise ImportError(f"No module named {name!r}")


    sys.meta_path.insert(0, BlockTriton())
    import warnings

    import torch

    import mxattention
    from mxattention.attention import reference_attention
    from mxattention.cli.main import main
    from mxattention.kernels import HAS_TRITON

    assert not HAS_TRITON
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 64) for _ in range(3))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for method in mxattention.list_methods():
            out = mxattention.scaled_dot_product_attention(q, k, v, method=method)
            cfg = mxattention.get_method(method)
            assert torch.equal(out, reference_attention(q, k, v, cfg, scale=64**-0.5)[0]), method
    # The reference's warning names the reason and the fix.
    assert any("Triton is not installed" in str(w.message) and "mxattention[gpu]" in str(w.message) for w in caught)
    assert main(["--version"]) == 0
    assert main(["theory"]) == 0
    assert not [m for m in sys.modules if m == "triton" or m.startswith("triton.")]
    print("NO-TRITON-OK")
    """
)


def test_package_imports_and_computes_without_triton():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "NO-TRITON-OK" in proc.stdout
    assert "mxattention" in proc.stdout  # --version's line
