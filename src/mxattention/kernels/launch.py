"""Launching a planned kernel: through Triton's JIT once, then the compiled kernel directly.

Exposes `launch(kernel, grid, args, kwargs, slot)`, `current_stream` and `DIRECT_LAUNCH_ENV`. A `slot` is (the launch
table of a cached plan, `KernelPlan.launches`; a key naming the launch in that plan): the first
launch of a slot goes through `kernel[grid](*args, **kwargs)` (argument binding, specialization,
the compile cache, the launch), which returns the compiled kernel; later launches of that slot call
the compiled kernel's launcher with the same argument layout, skipping the binding (tens of
microseconds per launch on the H200's host, `benchmarks/results/host_h200.md`), and, while no
Triton launch hook is installed, the runner's per-launch device / stream lookup and launch metadata
(a call program looks the stream up once per call: `current_stream`). That is sound
because a cached plan is keyed by everything Triton specializes on (`plan.plan_key`: dtypes,
shapes, strides and 16-byte alignment of the operands, so every derived length, stride and buffer
alignment is the same in every call of the slot), and each slot's grid and constexprs are fixed
by the plan. Without a slot, on Triton's interpreter, with MXATTENTION_DIRECT_LAUNCH=0, or where
this Triton's objects lack what the direct path uses (`JITFunction.device_caches`' binder,
`CompiledKernel.__getitem__`; Triton 3.6 and 3.9 have both), the normal launch runs every time.
"""

from __future__ import annotations

import os
import threading

from mxattention.kernels._triton import kernels_interpreted

DIRECT_LAUNCH_ENV = "MXATTENTION_DIRECT_LAUNCH"
_UNAVAILABLE = object()  # a slot whose kernel launches the normal way (no direct path here)
_local = threading.local()  # .recorder: the `program.Recording` watching this thread's run, if any


def set_recorder(recorder) -> None:
    """Hand this thread's launches to `recorder` (a `program.Recording`), or back (None)."""
    _local.recorder = recorder


def direct_or_none(runner):
    """A slot's direct runner, or None where the slot launches through Triton's JIT."""
    return None if runner is None or runner is _UNAVAILABLE else runner


def direct_launch_enabled() -> bool:
    """Whether cached plans launch their compiled kernels directly (MXATTENTION_DIRECT_LAUNCH, default 1;
    never on the interpreter, which has no compiled kernel)."""
    return os.environ.get(DIRECT_LAUNCH_ENV, "1") not in ("", "0") and not kernels_interpreted()


def launch(kernel, grid: tuple, args: tuple, kwargs: dict, slot: tuple[dict, object] | None = None) -> None:
    """Launch `kernel[grid](*args, **kwargs)`; with a `slot` of a cached plan, directly after the first
    time. Under a `program.Recording` the launch is also kept for the plan's program."""
    recorder = getattr(_local, "recorder", None)
    if recorder is not None:
        recorder.launch(kernel, grid, args, kwargs, slot)
        return
    launch_now(kernel, grid, args, kwargs, slot)


def launch_now(
    kernel, grid: tuple, args: tuple, kwargs: dict, slot: tuple[dict, object] | None = None
) -> None:
    """`launch` without a recorder."""
    if slot is None:
        kernel[grid](*args, **kwargs)
        return
    table, key = slot
    runner = table.get(key)
    if runner is None:
        compiled = kernel[grid](*args, **kwargs)
        table[key] = (
            _runner(kernel, compiled, grid, args, kwargs) if direct_launch_enabled() else _UNAVAILABLE
        )
    elif runner is _UNAVAILABLE:
        kernel[grid](*args, **kwargs)
    else:
        runner(args)


def _runner(kernel, compiled, grid: tuple, args: tuple, kwargs: dict):
    """A function of the positional arguments that launches `compiled` as `kernel[grid]` would, or
    `_UNAVAILABLE` where this Triton does not offer the pieces. The launcher takes every parameter's
    value in signature order (constexprs included), as `JITFunction.run` passes its bound arguments."""
    try:
        from triton.runtime.driver import driver

        binder = kernel.device_caches[driver.active.get_current_device()][-1]
        bound = binder(*args, **kwargs)[0]  # {parameter name: value}, defaults applied
        names = list(bound)
        if names[: len(args)] != [p.name for p in kernel.params[: len(args)]]:
            return _UNAVAILABLE
        tail = tuple(bound[n] for n in names[len(args) :])
        if any(hasattr(t, "data_ptr") for t in tail):  # a tensor by keyword would be frozen in
            return _UNAVAILABLE
        grid3 = tuple(grid) + (1,) * (3 - len(grid))
        run = compiled[grid3]  # `CompiledKernel.__getitem__` (initializes the handles)
        launcher, function, packed = compiled.run, compiled.function, compiled.packed_metadata
        from triton import knobs

        hooks = knobs.runtime
    except Exception:  # another Triton's internals: the normal launch stays correct
        return _UNAVAILABLE

    def direct(call_args: tuple, stream: int | None = None) -> None:
        """Launch with the positional arguments `call_args` on `stream` (a raw CUDA stream; None: the
        current one). What `CompiledKernel.__getitem__`'s runner does, less its per-launch work that
        a cached slot does not need: the device and stream looked up once per call by the caller (a
        call program), and no launch metadata while no launch hook is installed (Triton 3.6 builds a
        dict per launch and calls its empty hook chains from C; a profiler's hook still gets the
        normal runner)."""
        enter, leave = hooks.launch_enter_hook, hooks.launch_exit_hook
        if _hooked(enter) or _hooked(leave):
            run(*call_args, *tail, stream=stream)
            return
        if stream is None:
            stream = current_stream()
        launcher(*grid3, stream, function, packed, None, None, None, *call_args, *tail)

    return direct


def _hooked(hook) -> bool:
    """Whether a Triton launch hook is installed: a function, or a hook chain with calls (3.6+)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def current_stream() -> int:
    """The raw CUDA stream Triton launches on now: the current device's current stream."""
    from triton.runtime.driver import driver  # imported here: launch.py loads without Triton

    active = driver.active
    return active.get_current_stream(active.get_current_device())
