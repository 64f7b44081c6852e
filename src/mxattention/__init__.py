"""mxattention: 4-bit MXFP4 attention as accurate as FP16, with no calibration data.

`scaled_dot_product_attention(q, k, v, ..., method="mxattention")` is a drop-in for torch's SDPA;
`mxattention.formats` holds the exact MX / NVFP4 casts; `mxattention.theory` the UOS derivation.
"""

from mxattention.attention import AttentionConfig, QuantSpec, get_method, list_methods, merge_attention
from mxattention.dispatch import scaled_dot_product_attention
from mxattention.integrations import (
    FallbackError,
    FallbackWarning,
    PrecisionPolicy,
    disable,
    enable,
    patch_sdpa,
)
from mxattention.kernels.op import InferenceOnlyError, ReferenceFallbackWarning
from mxattention.varlen import varlen_attention

__version__ = "0.1.0"

__all__ = [
    "AttentionConfig",
    "FallbackError",
    "FallbackWarning",
    "InferenceOnlyError",
    "PrecisionPolicy",
    "QuantSpec",
    "ReferenceFallbackWarning",
    "disable",
    "enable",
    "get_method",
    "list_methods",
    "merge_attention",
    "patch_sdpa",
    "scaled_dot_product_attention",
    "varlen_attention",
]
