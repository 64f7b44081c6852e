"""A cached plan's call as a program: its launches recorded once, then replayed with fresh pointers.

Exposes `eligible(plan)`, `Recording` (the context that watches one run of a plan) and `CallProgram`
(`run(roots) -> (out, lse)`), and `PROGRAMS_ENV`.

Why: a call's host time is mostly Python around its few launches (argument checks of each launcher,
views, TMA descriptors, one allocation per buffer; `benchmarks/results/host_h200.md`). Everything
that Python computes is fixed by the plan's key (`plan.plan_key`: shapes, strides, dtypes, 16-byte
alignment), except the addresses of the inputs and of the buffers the call allocates. So the first
call of a cached single-chunk plan runs normally under a `Recording`, which keeps each launch (kernel,
grid, arguments, the slot's direct runner) and each allocation, and refuses to make a program if the
run did any tensor work other than allocations and views (a `TorchDispatchMode` sees every torch
op): then every result of the call comes from the recorded launches. Each argument is then a
constant, an address in an input (query, key, value, mask: the root it is, at the same offset), or an
address in a buffer of the run. The replay allocates O and lse as the run did and every other buffer
as one workspace (the same bytes, freed at the same point: the end of the call), and makes the
launches with those addresses: on a GPU through the slots' direct runners with integer addresses and
TMA descriptors rebuilt from them; on Triton's interpreter through `kernel[grid]` with the tensors
rebuilt as views of the same storages (that is how the CPU tests check the mapping).

A recording that cannot tell which input an argument came from (two inputs at one address, or a view
inside storage two inputs share) makes no program; the next call records again, twice at most.
MXATTENTION_CALL_PROGRAMS=0 turns programs off (the normal path runs every call).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, is_dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from mxattention.kernels import launch as _launch
from mxattention.kernels._triton import kernels_interpreted

PROGRAMS_ENV = "MXATTENTION_CALL_PROGRAMS"
PROGRAM_SLOT = "program"  # the key of a plan's program in its launch table (`KernelPlan.launches`)
ATTEMPTS = 2  # recordings per plan before it keeps the normal path
_ALIGN = 512  # the caching allocator's block alignment: each buffer's offset in the workspace

_aten = torch.ops.aten
_ALLOCS = {_aten.empty.memory_format, _aten.empty_strided.default}
# Ops that read only metadata (no kernel); every other non-view op is work a replay would skip.
_META = {
    _aten.is_contiguous.default,
    _aten.is_contiguous.memory_format,
    _aten.sym_size.int,
    _aten.sym_stride.int,
    _aten.sym_numel.default,
    _aten.sym_storage_offset.default,
    _aten.is_non_overlapping_and_dense.default,
    _aten.detach_.default,  # autograd metadata only
}


def programs_enabled() -> bool:
    """Whether cached plans replay recorded programs (MXATTENTION_CALL_PROGRAMS, default 1)."""
    return os.environ.get(PROGRAMS_ENV, "1") not in ("", "0")


def eligible(plan) -> bool:
    """Whether a cached dense plan may get a program: one chunk on one stream, no debug output, the
    exact kernels (the recording decides the rest)."""
    return (
        plan.launches is not None
        and plan.runs
        and not plan.varlen
        and not plan.debug_p
        and len(plan.chunks) == 1
        and plan.chunk_streams == 1
        and plan.mma == "exact"  # the fast mode's runner launches outside `launch.launch`
        and programs_enabled()
    )


class _Watch(TorchDispatchMode):
    """Records the allocations of a run and the first op a replay would not repeat."""

    def __init__(self) -> None:
        super().__init__()
        self.allocs: list[torch.Tensor] = []
        self.refused: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in _ALLOCS:
            self.allocs.append(out)
        elif not (func.is_view or func in _META) and self.refused is None:
            self.refused = str(func)
        return out


@dataclass
class _Launch:
    kernel: object
    grid: tuple
    args: tuple
    kwargs: dict
    runner: Callable | None  # the slot's direct runner (`launch._runner`), None where there is none


class Recording:
    """Watch one run: `with Recording() as rec: result = run(...)`, then `rec.program(roots, outs)`."""

    def __init__(self) -> None:
        self.launches: list[_Launch] = []
        self._watch = _Watch()

    def __enter__(self) -> Recording:
        self._watch.__enter__()
        _launch.set_recorder(self)
        return self

    def __exit__(self, *exc) -> None:
        _launch.set_recorder(None)
        self._watch.__exit__(*exc)

    def launch(self, kernel, grid: tuple, args: tuple, kwargs: dict, slot) -> None:
        """Make the launch (its own tensor work, the interpreter's, is not the call's) and keep it."""
        with _disable_current_modes():
            _launch.launch_now(kernel, grid, args, kwargs, slot)
        runner = None if slot is None else slot[0].get(slot[1])
        self.launches.append(
            _Launch(kernel, tuple(grid), tuple(args), dict(kwargs), _launch.direct_or_none(runner))
        )

    def program(
        self, roots: Sequence[torch.Tensor | None], outs: Sequence[torch.Tensor]
    ) -> CallProgram | None:
        """The program of the recorded run, whose inputs were `roots` and results `outs` (tensors the
        run allocated), or None where a replay could not reproduce it."""
        if self._watch.refused is not None or not self.launches:
            return None
        direct = not kernels_interpreted()
        if direct and any(rec.runner is None for rec in self.launches):
            return None
        try:
            return _build(self.launches, self._watch.allocs, list(roots), list(outs), direct)
        except _Unmapped:
            return None


class _Unmapped(Exception):
    """An argument the program cannot place."""


@dataclass(frozen=True)
class _Place:
    """Where a tensor lies in a call: base `base` (a root, an output, the workspace) + `offset` bytes;
    with the dtype, shape and strides to rebuild it (the interpreter)."""

    base: int
    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]


@dataclass(frozen=True)
class _DescHole:
    """A TMA descriptor argument: its base tensor's place, the descriptor's class and its other
    fields (no tensor: a program keeps none of the recorded run's memory alive)."""

    place: _Place
    cls: type
    fields: tuple[tuple[str, object], ...]


class _Ptr:
    """An address with the `data_ptr()` Triton's launcher asks a pointer argument or descriptor base for."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr

    def data_ptr(self) -> int:
        return self.ptr


def _desc_type(hole: _DescHole) -> type:
    """The class of a replayed TMA descriptor: instances hold `base` (what Triton's launcher asks
    `data_ptr()` of: a `_Ptr` at the new address), every other field is the recorded descriptor's
    (shape, strides, padding, ... as this Triton's class has them), read from the class (no
    per-call copies or look-up hooks: host time)."""

    def __init__(self, base: _Ptr) -> None:
        self.base = base

    return type("_Desc", (), {"__slots__": ("base",), "__init__": __init__, **dict(hole.fields)})


def _is_desc(x) -> bool:
    return (
        is_dataclass(x) and not isinstance(x, type) and {"base", "block_shape"} <= {f.name for f in fields(x)}
    )


def _build(launches, allocs, roots, outs, direct: bool) -> CallProgram:
    # Bases: the roots, then the outputs, then the workspace.
    storages = {}  # storage address -> (base index, address of the base's first byte)
    for i, r in enumerate(roots):
        if r is None:
            continue
        s = r.untyped_storage().data_ptr()
        if s in storages:  # two inputs in one storage: a view inside it would be ambiguous
            storages[s] = None
        else:
            storages[s] = (i, r.data_ptr())
    root_ptrs: dict[int, int] = {}
    for i, r in enumerate(roots):
        if r is not None:
            p = r.data_ptr()
            root_ptrs[p] = -1 if p in root_ptrs else i
    n_roots = len(roots)
    out_specs = []
    alloc_place: dict[int, tuple[int, int]] = {}  # storage address -> (base, offset of its first byte)
    for j, o in enumerate(outs):
        t = next(
            (a for a in allocs if a.untyped_storage().data_ptr() == o.untyped_storage().data_ptr()), None
        )
        if t is None or t.data_ptr() != o.data_ptr() or t.shape != o.shape or t.stride() != o.stride():
            raise _Unmapped("a result is not a buffer the run allocated")
        out_specs.append((tuple(o.shape), tuple(o.stride()), o.dtype))
        alloc_place[o.untyped_storage().data_ptr()] = (n_roots + j, 0)
    ws_base, ws_bytes = n_roots + len(outs), 0
    for a in allocs:
        s = a.untyped_storage().data_ptr()
        if s not in alloc_place:
            alloc_place[s] = (ws_base, ws_bytes)
            ws_bytes += -(-a.untyped_storage().nbytes() // _ALIGN) * _ALIGN

    def place(t: torch.Tensor) -> _Place:
        p, s = t.data_ptr(), t.untyped_storage().data_ptr()
        meta = (t.dtype, tuple(t.shape), tuple(t.stride()))
        if s in alloc_place:
            base, first = alloc_place[s]
            return _Place(base, first + p - s, *meta)
        i = root_ptrs.get(p)
        if i is not None and i >= 0:
            return _Place(i, 0, *meta)
        owner = storages.get(s)
        if owner is None:
            raise _Unmapped("an argument in no input and no buffer of the run, or in storage inputs share")
        return _Place(owner[0], p - owner[1], *meta)

    steps = []
    for rec in launches:
        if any(isinstance(v, torch.Tensor) or _is_desc(v) for v in rec.kwargs.values()):
            raise _Unmapped("a tensor passed by keyword")
        template, holes = list(rec.args), []
        for pos, a in enumerate(rec.args):
            if isinstance(a, torch.Tensor):
                holes.append((pos, place(a)))
                template[pos] = None
            elif _is_desc(a):
                rest = tuple((f.name, getattr(a, f.name)) for f in fields(a) if f.name != "base")
                holes.append((pos, _DescHole(place(a.base), type(a), rest)))
                template[pos] = None
        # What a replay needs of the launch, without its arguments (the recorded run's tensors).
        steps.append(
            (_Launch(rec.kernel, rec.grid, (), rec.kwargs, rec.runner), tuple(template), tuple(holes))
        )
    return CallProgram(tuple(out_specs), ws_bytes, tuple(steps), direct)


def _rebuild(bases: list, where: _Place) -> torch.Tensor:
    """The tensor at `where` as a view of its base's storage (the interpreter's replay)."""
    base = bases[where.base]
    storage = base.untyped_storage()
    first = base.data_ptr() - storage.data_ptr() + where.offset
    itemsize = where.dtype.itemsize
    t = torch.empty(0, dtype=where.dtype, device=base.device)
    return t.set_(storage, first // itemsize, where.shape, where.stride)


class CallProgram:
    """The recorded launches of one cached plan; `run(roots)` makes them for new inputs of its key."""

    def __init__(self, outputs, ws_bytes: int, steps, direct: bool) -> None:
        self.outputs = outputs  # (shape, stride, dtype) of O and lse
        self.ws_bytes = ws_bytes
        self.direct = direct
        self.layout = tuple(steps)  # (launch without its arguments, arguments with holes, (position, place))
        self.steps = tuple(self._compile(rec, template, holes) for rec, template, holes in steps)

    def __len__(self) -> int:
        return len(self.steps)

    def _compile(self, rec: _Launch, template: tuple, holes: tuple) -> Callable[[list, list], None]:
        if not self.direct:

            def jit_step(bases: list, ptrs: list, stream: int | None) -> None:
                args = list(template)
                for pos, h in holes:
                    if isinstance(h, _DescHole):
                        args[pos] = h.cls(base=_rebuild(bases, h.place), **dict(h.fields))
                    else:
                        args[pos] = _rebuild(bases, h)
                rec.kernel[rec.grid](*args, **rec.kwargs)

            return jit_step
        run = rec.runner
        plain = tuple((pos, h.base, h.offset) for pos, h in holes if not isinstance(h, _DescHole))
        descs = tuple(
            (pos, h.place.base, h.place.offset, _desc_type(h)) for pos, h in holes if isinstance(h, _DescHole)
        )

        def direct_step(bases: list, ptrs: list, stream: int | None) -> None:
            args = list(template)
            for pos, b, off in plain:
                args[pos] = ptrs[b] + off
            for pos, b, off, desc in descs:
                args[pos] = desc(_Ptr(ptrs[b] + off))
            run(args, stream)

        return direct_step

    def bases(self, roots: Sequence[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """The tensors a replay's addresses start from: `roots`, then O and lse allocated as the
        recorded run allocated them, then the workspace of its other buffers."""
        device = roots[0].device
        outs = [
            torch.empty_strided(shape, stride, dtype=dt, device=device) for shape, stride, dt in self.outputs
        ]
        bases = [*roots, *outs]
        if self.ws_bytes:
            bases.append(torch.empty(self.ws_bytes, dtype=torch.uint8, device=device))
        return bases

    def launch(self, bases: list[torch.Tensor | None]) -> None:
        """Make the recorded launches on `bases` (`bases`)."""
        ptrs = [0 if b is None else b.data_ptr() for b in bases] if self.direct else []
        # One stream lookup per call, not one per launch (`launch._runner`).
        stream = _launch.current_stream() if self.direct else None
        for step in self.steps:
            step(bases, ptrs, stream)

    def run(self, roots: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        """Make the launches for `roots` (the inputs, in the recorded order); returns [O, lse]."""
        bases = self.bases(roots)
        self.launch(bases)
        return bases[len(roots) : len(roots) + len(self.outputs)]
