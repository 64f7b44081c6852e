"""The plan cache of dense calls: `kernel_plan` and `cached_plan`, what the custom ops (`mxattention.ops`) ask.

Exposes `kernel_plan(cfg, query, key, value, scale, ...)` (the call's `plan.KernelPlan`: its `reason`
is None if the fused kernels run it, else why they do not), `plan_key` and `cached_plan` (the same,
looked up by the call's signature: what the dense op runs).
"""

from __future__ import annotations

import torch

from mxattention.attention.config import AttentionConfig
from mxattention.attention.keys import config_from_key
from mxattention.kernels import prepass_hopper
from mxattention.kernels.plan import KernelPlan, cpu_kernels_requested, plan_call

# Dense plans by call signature (`plan_key`): planning costs more host time than the launches of a
# short call (H200: benchmarks/results/host_h200.md). Bounded: a model has a few dozen signatures.
_PLANS: dict[tuple, KernelPlan] = {}
PLAN_CACHE_SIZE = 256


def kernel_plan(
    cfg: AttentionConfig,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
    varlen: tuple[torch.Tensor, torch.Tensor, int, int] | None = None,
    varlen_kernel: bool = True,
) -> KernelPlan:
    """The plan of this call (`plan.plan_call` with the default options): `.reason` is None if the
    fused kernels run it, else why not (the config and inputs, then the scale, then varlen's own);
    `varlen_kernel`: whether a varlen call takes the one-launch kernel (`plan.plan_call`)."""
    return plan_call(
        cfg,
        query,
        key,
        value,
        scale=scale,
        mask=mask,
        is_causal=is_causal,
        varlen=varlen,
        varlen_kernel=varlen_kernel,
    )


def plan_key(
    cfg_key: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    mask: torch.Tensor | None,
    is_causal: bool,
) -> tuple:
    """Everything a dense plan reads (`plan.plan_call`): the method, each operand's device, dtype,
    shape, strides and base alignment (a pass's kernel reads 16-byte alignment and bf16 pairs), the
    mask's layout, causality, the scale, the interpreter switch and the Gluon passes that failed to
    build in this process."""
    operands = tuple((t.dtype, t.shape, t.stride(), t.data_ptr() % 16) for t in (query, key, value))
    masked = None if mask is None else (mask.dtype, mask.shape, mask.stride())
    env = (cpu_kernels_requested(), len(prepass_hopper._broken))
    return (cfg_key, query.device, operands, masked, is_causal, scale, env)


def cached_plan(
    cfg_key: str,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    scale: float,
    *,
    mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> KernelPlan:
    """`kernel_plan` of a dense call, computed once per `plan_key` (a plan is frozen data)."""
    sig = plan_key(cfg_key, query, key, value, scale, mask, is_causal)
    plan = _PLANS.get(sig)
    if plan is None:
        plan = kernel_plan(config_from_key(cfg_key), query, key, value, scale, mask=mask, is_causal=is_causal)
        if len(_PLANS) >= PLAN_CACHE_SIZE:
            _PLANS.clear()
        _PLANS[sig] = plan
    return plan
