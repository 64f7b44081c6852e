"""mxattention: attention in 4- and 8-bit OCP MX formats for video diffusion transformers, data-free.

`scaled_dot_product_attention(q, k, v, ..., method="mxattention")` is a drop-in for torch's SDPA;
`mxattention.formats` holds the exact MX / NVFP4 casts; `mxattention.theory` the UOS derivation.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from mxattention._version import __version__ as __version__

if TYPE_CHECKING:
    from mxattention.attention import AttentionConfig, QuantSpec, get_method, list_methods, merge_attention
    from mxattention.integrations import PrecisionPolicy, disable, enable, patch_sdpa
    from mxattention.ops import (
        FallbackError,
        FallbackWarning,
        InferenceOnlyError,
        ReferenceFallbackWarning,
        scaled_dot_product_attention,
        varlen_attention,
    )

# The public names are imported on first use (PEP 562), so that `import mxattention` alone, and with
# it the command line's --help and --version, does not pay for torch, Triton and torch._dynamo.
_HOMES = {
    "AttentionConfig": "mxattention.attention",
    "QuantSpec": "mxattention.attention",
    "get_method": "mxattention.attention",
    "list_methods": "mxattention.attention",
    "merge_attention": "mxattention.attention",
    "scaled_dot_product_attention": "mxattention.ops",
    "FallbackError": "mxattention.ops",
    "FallbackWarning": "mxattention.ops",
    "PrecisionPolicy": "mxattention.integrations",
    "disable": "mxattention.integrations",
    "enable": "mxattention.integrations",
    "patch_sdpa": "mxattention.integrations",
    "InferenceOnlyError": "mxattention.ops",
    "ReferenceFallbackWarning": "mxattention.ops",
    "varlen_attention": "mxattention.ops",
}
_SUBPACKAGES = (
    "attention",
    "cli",
    "eval",
    "formats",
    "integrations",
    "kernels",
    "ops",
    "rotation",
    "theory",
)

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


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        value = getattr(importlib.import_module(_HOMES[name]), name)
    elif name in _SUBPACKAGES:  # `import mxattention; mxattention.formats...` keeps working
        value = importlib.import_module(f"mxattention.{name}")
    else:
        raise AttributeError(f"module 'mxattention' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*__all__, *_SUBPACKAGES, "__version__"})
