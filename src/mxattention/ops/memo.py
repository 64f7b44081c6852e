"""Eager calls seen before: from a call's own arguments straight to the program that served it.

Exposes `signature` (the key of a call), `program` (the program remembered for it, or None),
`replay` (a program run on a call's tensors) and `remember` (called by `call.dense` once a cached
plan has a program).

Why: an eager call's host time is mostly Python before its launches (the checks, the routing, the
permutes of a framework's [B, S, H, D] layout, the plan's key and look-up; `benchmarks/results/
host_h200.md`). Each of those reads only the call's metadata: the tensors' types, devices, dtypes,
shapes, strides and 16-byte alignment, the scalar arguments (value and type), the method, and for
CPU tensors the CPU-kernels switch. So a call whose metadata equal an earlier call's that passed its
checks, was served by the kernels and recorded a program (`kernels.program.CallProgram`) gets the
same verdict and the same launches, at its own addresses: the program replays on the call's own
tensors, with no check, plan or permute made again. A framework's layout changes nothing there: a
permuted view has its tensor's address, and the program needs only addresses.

Only plain eager calls get a signature (`call.plain_eager`'s conditions): under torch.compile, a
dispatch mode, with tensor subclasses or tensors autograd tracks the ops run as before. A
router's decision (policy, counts) is still made per call, by the caller, before the replay.

The programs are kept in the planner's cache (`kernels.plan._PLANS`), under keys that start with
`_TAG` and so never equal a plan's: whatever drops or replaces the plans (its size bound, a test)
drops these with them, and a replay never outlives the plans it was recorded from.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode as _current_dispatch_mode

from mxattention.attention.reference import cast_output
from mxattention.kernels import plan as _plan
from mxattention.kernels.plan import cpu_kernels_requested
from mxattention.kernels.program import PROGRAM_SLOT, CallProgram

_Tensor = torch.Tensor
_TAG = object()  # the first item of every memo key (no plan key starts with it)


def signature(
    where: str,
    query: object,
    key: object,
    value: object,
    attn_mask: object,
    dropout_p: object,
    is_causal: object,
    scale: object,
    enable_gqa: object,
) -> tuple | None:
    """The memo key of a call made at `where` (the method's key for the public entry, a router's
    token for a patch or backend), or None for a call that is not plain eager (traced, under a
    dispatch mode, tensor subclasses or a mask that is not a tensor)."""
    if (
        type(query) is not _Tensor
        or type(key) is not _Tensor
        or type(value) is not _Tensor
        or (attn_mask is not None and type(attn_mask) is not _Tensor)
        or torch.compiler.is_compiling()
        or _current_dispatch_mode() is not None
    ):
        return None
    q, k, v, m = query, key, value, attn_mask
    if torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad or (m is not None and m.requires_grad)
    ):
        return None  # autograd records the op (its backward raises): not a plain call
    # One flat tuple, hashed per call. The scalars' types too: True == 1 == 1.0 hash alike, and
    # the checks tell a bool scale or an int is_causal from the value they were given.
    return (
        _TAG, where, None if q.is_cuda else cpu_kernels_requested(),
        dropout_p, type(dropout_p), is_causal, type(is_causal), scale, type(scale), enable_gqa, type(enable_gqa),
        q.device, q.dtype, q.shape, q.stride(), q.data_ptr() & 15,
        k.device, k.dtype, k.shape, k.stride(), k.data_ptr() & 15,
        v.device, v.dtype, v.shape, v.stride(), v.data_ptr() & 15,
        None if m is None else (m.device, m.dtype, m.shape, m.stride(), m.data_ptr() & 15),
    )  # fmt: skip


def program(sig: tuple | None) -> CallProgram | None:
    """The program remembered for the signature `sig`, or None."""
    return None if sig is None else _plan._PLANS.get(sig)  # type: ignore[return-value]


def replay(prog: CallProgram, roots: Sequence[_Tensor | None]) -> tuple[_Tensor, _Tensor]:
    """(O [B, Hq, Lq, Dv] in the query's dtype, lse [B, Hq, Lq] fp32) of `prog` run on `roots`
    (query, key, value, mask: the call's own tensors, any view of the recorded layout at the same
    address)."""
    out, lse = prog.run(roots)
    return cast_output(out, roots[0].dtype), lse


def remember(sig: tuple | None, launches: dict | None) -> None:
    """Keep the program of a plan's launch table (`KernelPlan.launches`) for `sig`, if it has one."""
    prog = None if sig is None or launches is None else launches.get(PROGRAM_SLOT)
    if isinstance(prog, CallProgram):
        if len(_plan._PLANS) >= _plan.PLAN_CACHE_SIZE:  # bounded with the plans (`plan.cached_plan`)
            _plan._PLANS.clear()
        _plan._PLANS[sig] = prog
