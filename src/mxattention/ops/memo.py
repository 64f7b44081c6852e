"""Eager calls seen before: from a call's own arguments straight to the program that served it.

Exposes `plain_eager`, `signature` (the key of a call), `program` (the program remembered for it, or None),
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

Only plain eager calls get a signature (`plain_eager`): under torch.compile, a
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


def plain_eager(*tensors: object) -> bool:
    """Whether a call may run an op's body directly, skipping the dispatcher (~20 us of the H200's
    host per call, benchmarks/results/probe_host_h200.json): eager (not traced by torch.compile), no
    dispatch mode active (fake tensors, flop counters see the op), plain tensors (or None), and no
    autograd to record (the ops' backward raises `InferenceOnlyError`)."""
    if torch.compiler.is_compiling() or _current_dispatch_mode() is not None:
        return False
    grad = torch.is_grad_enabled()
    for t in tensors:  # a loop, not all() of a generator: this runs on every call (host time)
        if t is not None and (type(t) is not _Tensor or (grad and t.requires_grad)):
            return False
    return True


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
    token for a patch or backend), or None for a call that is not `plain_eager` (traced, under a
    dispatch mode, tensor subclasses, a mask that is not a tensor, autograd to record)."""
    if not plain_eager(query, key, value, attn_mask):
        return None
    q, k, v, m = query, key, value, attn_mask
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
        _plan.keep(sig, prog)  # bounded with the plans
