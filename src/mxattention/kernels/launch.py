"""Launching a planned kernel: through Triton's JIT once, then the compiled kernel directly.

Exposes `launch(kernel, grid, args, kwargs, slot)`, `current_stream`, `descriptor_expander` and
`DIRECT_LAUNCH_ENV`. A `slot` is (the launch
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
        c_launch = _c_launcher(launcher, len(args))
    except Exception:  # another Triton's internals: the normal launch stays correct
        return _UNAVAILABLE
    if c_launch is not None:  # Triton 3.6: its launcher's C function itself (`_c_launcher`)
        c_fn, descs, coop, pdl = c_launch
        flatten = descriptor_expander(descs)

        def send(stream: int, call_args: tuple) -> None:
            c_fn(
                *grid3,
                stream,
                function,
                coop,
                pdl,
                None,
                None,
                packed,
                None,
                None,
                None,
                *flatten(call_args),
                *tail,
            )

    else:

        def send(stream: int, call_args: tuple) -> None:
            launcher(*grid3, stream, function, packed, None, None, None, *call_args, *tail)

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
        send(current_stream() if stream is None else stream, call_args)

    direct.calls_c_launcher = c_launch is not None  # type: ignore[attr-defined]
    return direct


def _c_launcher(launcher, n_args: int):
    """(C launch function, ((argument position, descriptor metadata, expansion), ... last first),
    cooperative-grid flag, PDL flag) of Triton 3.6's `CudaLauncher`, or None for any other launcher
    (then `direct` calls the launcher object). Its `__call__` is Python that, per launch, makes two
    scratch allocations (none for kernels without scratch) and, for kernels with TMA descriptor
    arguments, a wrapper loops over every argument to expand each descriptor (`make_tensordesc_arg`:
    the filled CUtensorMap, shape and strides): ~4 us per launch on the CPU machine, ~3x that on the
    H200's host. Calling the C function with the same flat arguments skips both; the expansion is
    still Triton's own function (`descriptor_expander` reuses it while an address repeats). The
    layout read is 3.6's (`_BASE_ARGS_FORMAT` of 13 items, the wrapper's closure); anything else, or
    a kernel with scratch memory, keeps the launcher."""
    try:
        import triton
        from triton.backends.nvidia import driver as nv
    except Exception:  # no CUDA backend here
        return None
    if not triton.__version__.startswith("3.6.") or type(launcher) is not nv.CudaLauncher:
        return None
    if getattr(nv, "_BASE_ARGS_FORMAT", None) != "iiiKKppOOOOOO":
        return None
    if launcher.global_scratch_size or launcher.profile_scratch_size or launcher.num_ctas != 1:
        return None
    fn, descs = launcher.launch, ()
    if getattr(fn, "__qualname__", "") == "wrap_handle_tensordesc.<locals>.inner":
        cells = dict(zip(fn.__code__.co_freevars, (c.cell_contents for c in fn.__closure__), strict=True))
        indices, metas = sorted(cells["tensordesc_indices"]), cells["tensordesc_meta"]
        if len(metas) != len(indices) or not indices or indices[-1] >= n_args:
            return None  # a descriptor past the positional arguments (the tail): keep the launcher
        fn = cells["launcher"]
        descs = tuple(
            (i, m, nv.make_tensordesc_arg) for i, m in reversed(list(zip(indices, metas, strict=True)))
        )
    elif not callable(fn) or hasattr(fn, "__code__"):
        return None  # not the C function itself
    return fn, descs, launcher.launch_cooperative_grid, launcher.launch_pdl


def descriptor_expander(descs: tuple):
    """A function of a launch's positional arguments that returns them with each TMA descriptor at
    the positions `descs` names ((position, metadata, expansion), last first) replaced by its
    expansion (Triton's `make_tensordesc_arg`: the filled CUtensorMap, shape and strides). A slot's
    descriptors differ between launches only in their base address (the plan fixes shapes, strides
    and blocks), so each position keeps its last expansion with the address it was made for and
    reuses it while the address repeats (a model's loop gets the same buffers back from the
    caching allocator), one tuple swapped whole so that threads sharing the slot never pair one
    address with another's expansion."""
    if not descs:
        return lambda call_args: call_args
    last: list = [(None, None)] * len(descs)

    def flatten(call_args: tuple) -> list:
        flat = list(call_args)
        for j, (i, meta, expand) in enumerate(descs):  # last first: the earlier positions stay put
            desc = flat[i]
            ptr = desc.base.data_ptr()
            kept = last[j]
            if kept[0] != ptr:
                kept = last[j] = (ptr, expand(desc, meta))
            flat[i : i + 1] = kept[1]
        return flat

    return flatten


def _hooked(hook) -> bool:
    """Whether a Triton launch hook is installed: a function, or a hook chain with calls (3.6+)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def current_stream() -> int:
    """The raw CUDA stream Triton launches on now: the current device's current stream."""
    from triton.runtime.driver import driver  # imported here: launch.py loads without Triton

    active = driver.active
    return active.get_current_stream(active.get_current_device())
