"""Optional Triton import: the package imports without Triton; kernels need it.

Exposes `HAS_TRITON`, `triton`, `tl` (None when Triton is missing), `kernels_interpreted()` and
`sm_count(device)` (the SMs that launch grids are sized against).
Triton decides at decoration time (the module import) whether a kernel is compiled or runs on its
CPU interpreter (TRITON_INTERPRET=1), so a kernel decorated here, not the environment, is asked
which it is.
"""

from __future__ import annotations

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # the CPU install without the `gpu` extra
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]
    HAS_TRITON = False


if HAS_TRITON:

    @triton.jit
    def _probe():
        """Decorated on import, before any kernel (every kernel module imports this one): what
        Triton made of it, it made of them."""
        pass


def kernels_interpreted() -> bool:
    """True when this process's kernels were built for the CPU interpreter."""
    if not HAS_TRITON:
        return False
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_probe, InterpretedFunction)


def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device."""
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count
