"""Fused Triton kernels of the attention variants (docs/design.md, 'Kernel plan'), forward only.

Imports `mxattention.attention` and `mxattention.formats`; nothing there imports this package.
Modules: `cast` (device functions of the MXFP4 cast), `hadamard` (the rotation of tile rows),
`rules` (a scale rule as kernel constants), `prepass` (rotation + cast of Q, K, V to packed bytes),
`prepass_hopper` (the rotated K^ and Q^ passes as Gluon kernels, sm_90), `attention_fwd` (the
online-softmax kernel), `attention_fwd_hopper` (the warp-specialized Gluon forward, sm_90),
`smoothing` (Q smoothing's correction on tensor cores), `plan` (every choice of one call, made
once: `plan_call` -> `KernelPlan`), `fused` / `fused_varlen` (the execution of a plan: both
kernels, for one `AttentionConfig`), `op` (the plan cache the custom ops of
`mxattention.ops` ask), `targets` (the GPU Triton builds for, and the per-architecture tiles),
`codegen` (the attention kernel built offline for a target, and what its assembly holds).
Triton is optional: `HAS_TRITON` says whether the kernels can run at all.
"""

from mxattention.kernels._triton import HAS_TRITON, kernels_interpreted

__all__ = ["HAS_TRITON", "kernels_interpreted"]
