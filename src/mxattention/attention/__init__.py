"""The attention algorithm in PyTorch: method configs, the tiled reference, merging.

This package is the specification the fused kernels are tested against and the path every CPU
user runs. It imports `mxattention.formats` and `mxattention.rotation` only.
"""

from mxattention.attention.config import (
    ABLATION,
    PRESETS,
    AttentionConfig,
    QuantSpec,
    get_method,
    list_methods,
)
from mxattention.attention.merge import merge_attention
from mxattention.attention.reference import reference_attention
from mxattention.attention.sdpa import sdpa_reference

__all__ = [
    "ABLATION",
    "PRESETS",
    "AttentionConfig",
    "QuantSpec",
    "get_method",
    "list_methods",
    "merge_attention",
    "reference_attention",
    "sdpa_reference",
]
