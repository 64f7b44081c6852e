"""The public errors and warnings of a call, and the one table of fallback reasons.

Exposes `ReferenceFallbackWarning` (the kernels cannot run a call; the exact PyTorch reference does),
`InferenceOnlyError` (a backward reached a 4-bit call), `FallbackError` / `FallbackWarning` (a patch
or backend ran torch's SDPA for a call), `REASONS` (why a call runs torch's SDPA, and the fix),
`inference_only_message` and `warn_reference_once`.
"""

from __future__ import annotations

from mxattention._callsite import warn_at_call_site


class ReferenceFallbackWarning(UserWarning):
    """The fused kernels cannot run a call; the PyTorch reference (exact, slow) computes it."""


class InferenceOnlyError(NotImplementedError):
    """A backward pass reached a 4-bit attention call: the 4-bit path has no gradient (a RuntimeError)."""


class FallbackError(RuntimeError):
    """strict=True: a call the 4-bit path cannot serve would have run torch's SDPA."""


class FallbackWarning(UserWarning):
    """A call the 4-bit path cannot serve ran torch's SDPA (warned once per reason per patch / backend)."""


# Why a patched or backend call runs torch's SDPA: reason -> (what happened, how to get it quantized).
# The first eight are `attention.inputs.sdpa_problem`'s (REASON_NAMES), the call's own facts.
REASONS: dict[str, tuple[str, str]] = {
    "tensor_type": (
        "tensor subclass (DTensor, nested or fake tensor, ...)",
        "pass plain tensors (for sharded sequences use diffusers' context parallelism with the "
        "mxattention backend)",
    ),
    "dtype": (
        "inputs not all of one dtype among fp32 / fp16 / bf16",
        "cast query, key and value to one of fp32, fp16, bf16",
    ),
    "ndim": ("inputs not 4-D [B, H, L, D]", "pass 4-D query, key and value"),
    "device": ("query, key and value on different devices", "move them to one device"),
    "dropout": ("dropout_p > 0", "put the model in eval mode (model.eval()) for inference"),
    "scale": ("scale not a Python number", "pass scale as a float or None"),
    "shape": (
        "shapes that disagree",
        "check the call (torch's SDPA raises its own error for invalid shapes)",
    ),
    "mask": (
        "a mask of another dtype or device, not broadcastable to [B, H, Lq, Lk], or given with "
        "is_causal=True",
        "pass a bool or float mask on the inputs' device, or is_causal without a mask",
    ),
    "varlen_mask": (
        "a mask that is not a bool key-padding mask ([B, Sk] or [B, 1, 1, Sk], True = attend)",
        "use the dense 'mxattention' backend (register_diffusers_backend) for other masks",
    ),
    "autograd": ("inputs that require grad, with autograd='torch'", "chosen: not a fallback to fix"),
}

_WARNED: set[str] = set()


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


def warn_reference_once(reason: str) -> None:
    """One `ReferenceFallbackWarning` per reason (a `KernelPlan.reason`) per process."""
    if reason not in _WARNED:
        _WARNED.add(reason)
        warn_at_call_site(
            f"mxattention: using the PyTorch reference, not the fused kernels: {reason}.",
            ReferenceFallbackWarning,
        )
