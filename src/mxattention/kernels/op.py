"""The torch custom op `mxattention::sdpa`: one opaque node for torch.compile, kernel or reference inside.

Exposes `sdpa_op(query, key, value, attn_mask, is_causal, scale, enable_gqa, cfg_key)` (the op),
`config_key(cfg)` / `config_from_key(key)` (an `AttentionConfig`, or a preset's name, as the op's
string argument) and
`kernel_plan(cfg, query, key, value, scale, ...)` and `cached_plan` (re-exported from the planner,
`kernels.plan`: the call's `plan.KernelPlan`, looked up by call signature in `cached_plan`),
`InferenceOnlyError` and `no_backward` (the op that raises it when a backward reaches a 4-bit call).

The choice between the fused kernels and the PyTorch reference happens inside the op at run time,
so a compiled graph holds a single node whatever the device, and the reference's one warning per
reason is issued there, outside the traced code, attributed to the user's line. `register_fake`
gives the output shapes. The op is inference-only: its registered backward is the `no_backward` op,
which raises `InferenceOnlyError` when a backward pass runs (not when one is traced: a compiled
forward of inputs that require grad compiles and runs; only `.backward()` fails).
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import torch

from mxattention._callsite import warn_at_call_site
from mxattention.attention.config import AttentionConfig
from mxattention.attention.sdpa import checked_sdpa_reference
from mxattention.kernels.fused import run_plan
from mxattention.kernels.plan import (  # the plan cache lives in the planner; re-exported for the op's callers
    KernelPlan,
    cached_plan,
    config_from_key,
    kernel_plan,
    plan_key,
)

__all__ = [
    "InferenceOnlyError",
    "KernelPlan",
    "ReferenceFallbackWarning",
    "cached_plan",
    "config_from_key",
    "config_key",
    "inference_only_message",
    "kernel_plan",
    "no_backward",
    "plan_key",
    "register_inference_only",
    "run_plan",
    "sdpa_op",
]

_WARNED: set[str] = set()


class ReferenceFallbackWarning(UserWarning):
    """The fused kernels cannot run a call; the PyTorch reference (exact, slow) computes it."""


class InferenceOnlyError(NotImplementedError):
    """A backward pass reached a 4-bit attention call: the 4-bit path has no gradient (a RuntimeError)."""


def inference_only_message(where: str) -> str:
    """The error text for a backward through `where` (a function or a patch, as the user wrote it)."""
    return (
        f"{where}: a backward pass reached a 4-bit attention call; the 4-bit path is inference-only "
        "(it has no backward). For training or fine-tuning, run torch's SDPA for the calls that track "
        "gradients: patch_sdpa(..., autograd='torch'), enable(..., autograd='torch') or "
        "register_diffusers_backend(..., autograd='torch'), or call "
        "torch.nn.functional.scaled_dot_product_attention instead of "
        "mxattention.scaled_dot_product_attention. For inference, run the model under torch.no_grad() "
        "or torch.inference_mode()."
    )


@torch.compiler.assume_constant_result
def config_key(cfg: AttentionConfig) -> str:
    """A JSON string that `config_from_key` turns back into an equal `AttentionConfig`."""
    return json.dumps(cfg.to_dict(), sort_keys=True)


def _warn_once(reason: str) -> None:
    if reason not in _WARNED:
        _WARNED.add(reason)
        warn_at_call_site(
            f"mxattention: using the PyTorch reference, not the fused kernels: {reason}.",
            ReferenceFallbackWarning,
        )


@torch.library.custom_op("mxattention::no_backward", mutates_args=())
def no_backward(
    grad: torch.Tensor, q_shape: Sequence[int], k_shape: Sequence[int], v_shape: Sequence[int], where: str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The backward of a 4-bit call: raises `InferenceOnlyError` (its fake gives q / k / v-shaped
    gradients, so a forward that tracks gradients still compiles)."""
    raise InferenceOnlyError(inference_only_message(where))


@no_backward.register_fake
def _no_backward_fake(grad, q_shape, k_shape, v_shape, where):
    return grad.new_empty(q_shape), grad.new_empty(k_shape), grad.new_empty(v_shape)


def register_inference_only(op, where: str) -> None:
    """Give the custom op `op` (q, k, v first; outputs first O) a backward that raises."""

    def setup_context(ctx, inputs, output) -> None:
        ctx.shapes = [list(t.shape) for t in inputs[:3]]

    def backward(ctx, grad_out, *rest):
        dq, dk, dv = no_backward(grad_out, *ctx.shapes, where)
        return (dq, dk, dv, *(None for _ in range(len(op._opoverload._schema.arguments) - 3)))

    op.register_autograd(backward, setup_context=setup_context)


@torch.library.custom_op("mxattention::sdpa", mutates_args=())
def sdpa_op(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
    enable_gqa: bool,
    cfg_key: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(O [B, Hq, Lq, Dv] in query's dtype, lse [B, Hq, Lq] fp32) of the method `cfg_key` names."""
    cfg = config_from_key(cfg_key)
    # The arguments were checked once, by the caller (`dispatch.scaled_dot_product_attention`,
    # attention.inputs): shapes agree, GQA divides, the mask broadcasts.
    b, hq, lq, _ = query.shape
    mask = None if attn_mask is None else attn_mask.expand(b, hq, lq, key.shape[2])
    if 0 in (*query.shape, *key.shape, *value.shape):
        # Zero-size dims: nothing for the kernels to do; the reference returns torch SDPA's result.
        return checked_sdpa_reference(query, key, value, mask, is_causal, scale, cfg)
    plan = cached_plan(cfg_key, query, key, value, scale, mask=mask, is_causal=is_causal)
    if plan.reason is not None:
        _warn_once(plan.reason)
        return checked_sdpa_reference(query, key, value, mask, is_causal, scale, cfg)
    out, lse, _ = run_plan(plan, query, key, value, mask=mask, is_causal=is_causal)
    return out, lse


@sdpa_op.register_fake
def _sdpa_fake(query, key, value, attn_mask, is_causal, scale, enable_gqa, cfg_key):
    b, hq, lq, _ = query.shape
    out = query.new_empty((b, hq, lq, value.shape[-1]))
    return out, query.new_empty((b, hq, lq), dtype=torch.float32)


register_inference_only(sdpa_op, "mxattention.scaled_dot_product_attention")
