"""Optional Triton import: the package imports without Triton; kernels need it.

Exposes `HAS_TRITON`, `triton`, `tl`, `aggregate` (Triton's device-side struct decorator under one
name for every supported Triton), `kernels_interpreted()` and `sm_count(device)` (the SMs that
launch grids are sized against). Without Triton, `triton` and `tl` are `_Absent` stand-ins: the kernel
modules still import (their decorators, constexpr constants and annotations evaluate), and a kernel
that is launched anyway raises `TritonMissingError` naming the install command. The callers never get
that far: the plan reads `HAS_TRITON` and routes every call to the PyTorch reference
(tests/kernels/test_no_triton.py imports the package with Triton's import blocked).
Triton decides at decoration time (the module import) whether a kernel is compiled or runs on its
CPU interpreter (TRITON_INTERPRET=1), so a kernel decorated here, not the environment, is asked
which it is.
"""

from __future__ import annotations

import functools
import typing

INSTALL_HINT = "pip install 'mxattention[gpu]'"


class TritonMissingError(ImportError):
    """A Triton kernel was launched in a process without Triton."""


class _Absent:
    """Stands in for `triton` and `triton.language` without Triton: every attribute is another
    stand-in, `constexpr(x)` is x, a decorated function becomes a stand-in that raises
    `TritonMissingError` when it is launched or called."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Absent:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self._name}.{attr}")

    def constexpr(self, value=None):
        return value

    def __call__(self, *args, **kwargs):
        if self._name.endswith(".jit") or self._name.endswith(".autotune"):
            if len(args) == 1 and callable(args[0]) and not kwargs:  # @triton.jit
                return _Absent(getattr(args[0], "__name__", "kernel"))
            return self  # @triton.jit(...): the decorator itself
        raise TritonMissingError(f"{self._name} needs Triton, which is not installed ({INSTALL_HINT})")

    def __getitem__(self, grid) -> _Absent:  # kernel[grid](...)
        return self


try:
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # the CPU install without the `gpu` extra
    triton = _Absent("triton")  # type: ignore[assignment]
    tl = _Absent("triton.language")  # type: ignore[assignment]
    HAS_TRITON = False


def aggregate(cls: type) -> type:
    """`triton.aggregate` (Gluon's `gluon.aggregate`; Triton 3.6 has it only as
    `triton.language.core._aggregate`): a class whose annotated fields travel into jit functions as
    one argument, constexpr fields staying constexpr. The annotations are resolved first: Triton
    3.6 checks every field with isinstance against them, and modules written with `from __future__
    import annotations` hold them as strings. A class's own `__init__` (3.6 needs one; it only
    assigns fields) is marked as Triton's generated one is, which the kernel cache key then skips
    (3.9 refuses a plain function there). Without Triton the class is returned unchanged."""
    if not HAS_TRITON:
        return cls
    make = getattr(triton, "aggregate", None) or tl.core._aggregate
    cls.__annotations__ = typing.get_type_hints(cls)
    if "__init__" in cls.__dict__:
        cls.__init__.__triton_builtin__ = True
    return make(cls)


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


@functools.lru_cache(maxsize=16)
def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device (asked once per device: a property query costs
    microseconds of every call's host time)."""
    import torch

    return torch.cuda.get_device_properties(device).multi_processor_count
