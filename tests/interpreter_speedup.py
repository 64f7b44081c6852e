"""A test-harness speed-up of Triton's CPU interpreter (Triton 3.9), installed by tests/conftest.py.

The interpreter re-patches `triton.language` for every call of a device function (`@triton.jit`
helpers called from a kernel), once per program of the grid: `inspect.getmembers` over the whole
language and a few hundred attribute writes each time. Within one launch every such patch after the
first for the same language modules is redundant: the launch's own patches stay until it ends, and a
device call's patches are never undone (the interpreter keeps no scope for them). So here a device
call patches only the first time its modules are seen in a launch (and, outside a launch, always,
as before). The kernels compute exactly what they computed; only the repeated patching goes (about a
third of an interpreted kernel test's time). Any other Triton version keeps its own interpreter.
"""

from __future__ import annotations

import threading

SUPPORTED = ("3.9.",)
_state = threading.local()


def install() -> bool:
    """Patch the interpreter where its version is one this was checked against; True if installed."""
    import triton

    if not triton.__version__.startswith(SUPPORTED):
        return False
    import triton.language as tl
    import triton.runtime.interpreter as ti

    grid_call = ti.GridExecutor.__call__

    def launch(self, *args, **kwargs):
        outer = getattr(_state, "patched", None)
        _state.patched = set()  # the language modules patched during this launch
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            _state.patched = outer

    def device_call(self, *args, **kwargs):
        patched = getattr(_state, "patched", None)
        langs = frozenset(id(v) for v in self.fn.__globals__.values() if v is tl or v is tl.core)
        if patched is None or langs not in patched:
            ti._patch_lang(self.fn)
            if patched is not None:
                patched.add(langs)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise ti.InterpreterError(repr(e)) from e

    ti.GridExecutor.__call__ = launch
    ti.InterpretedFunction.__call__ = device_call
    return True
