"""What did not build in this process: a Gluon pre-pass's name, or a `tl` forward spec whose build
overflowed shared memory, with why.

Exposes `FAILURES` (what -> reason), `record` (once per failure; a Gluon pass with one warning that
names the error) and `fitted` (a forward spec with its stages lowered past every failed build of it).
The launchers record what they could not build; the planner (`plan.plan_call`) reads the record and
plans the fallback, and `plan.plan_key` holds its size, so a cached plan is made again. It sits
below every launcher and the planner, so each of them imports it without a circle.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

from mxattention.kernels.specs import BuildFailure, FwdSpec

FAILURES: dict[object, str] = {}


def record(failure: BuildFailure) -> None:
    """Record what a launcher could not build (once; a Gluon pass with one warning naming the error)."""
    import triton

    if failure.what in FAILURES:
        return
    FAILURES[failure.what] = failure.reason
    if isinstance(failure.what, str):
        warnings.warn(
            f"mxattention: the Gluon {failure.what} pre-pass does not build with Triton {triton.__version__} "
            f"({failure.reason[:300]}); using the tl kernel (same bytes, ~10 % slower pass)",
            RuntimeWarning,
            stacklevel=3,
        )


def fitted(spec: FwdSpec) -> FwdSpec:
    """`spec` with num_stages lowered past every build of it that overflowed shared memory here."""
    while spec in FAILURES and spec.num_stages > 1:
        spec = replace(spec, num_stages=spec.num_stages - 1)
    return spec


def broken_passes() -> frozenset[str]:
    """The Gluon pre-passes that did not build in this process."""
    return frozenset(k for k in FAILURES if isinstance(k, str))
