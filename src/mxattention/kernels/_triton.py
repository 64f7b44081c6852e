"""Optional Triton import: the package imports without Triton; kernels need it.

Exposes `HAS_TRITON`, `triton`, `tl` (None when Triton is missing) and `interpreting()`.
"""

from __future__ import annotations

import os

try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # the CPU install without the `gpu` extra
    triton = None  # type: ignore[assignment]
    tl = None  # type: ignore[assignment]
    HAS_TRITON = False


def interpreting() -> bool:
    """True when Triton runs kernels on the CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
